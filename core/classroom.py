"""A class for `bash scripts/lab.sh --class N`: a login per student and one for the teacher, the
login secret, and the class sheet to hand out (a CSV and a printable page of slips).

The class lives in one folder (`lab-class/` by default): `class.json` (mode 600) keeps each
login's password, its hash and the secret, so running the lab again keeps the same class and
the same slips; `--new-class` makes new ones. The app gets the hashes, never the passwords
(`app.env`, read by lab.sh); nothing here prints a password.
"""

from __future__ import annotations

import argparse
import csv
import html
import json
import os
import secrets
import sys
from dataclasses import asdict, dataclass
from ipaddress import ip_address
from pathlib import Path

from core.auth import hash_password

TEACHER = "teacher"
MAX_STUDENTS = 200
# Letters and digits a person copies from paper without doubt (no 0/O, 1/l/I).
PASSWORD_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"
PASSWORD_LENGTH = 10  # about 49 bits: far beyond what the login limits let anyone guess
CLASS_FILE, APP_ENV_FILE, SHEET_FILE, SLIPS_FILE = "class.json", "app.env", "class-sheet.csv", "class-slips.html"
# The objective the capacity sweep holds engines to (CAPACITY_SLO), by machine: a CPU gets one that
# vLLM's CPU build meets for a few people (docs/teachers/lesson-plan.md, Demo 4), a GPU the kind
# the article's figures meet.
CPU_SLO = "ttft_ms=3000,tpot_ms=200"
GPU_SLO = "ttft_ms=500,tpot_ms=50"


def student_name(number: int) -> str:
    return f"student{number:02d}"


def new_password() -> str:
    return "".join(secrets.choice(PASSWORD_ALPHABET) for _ in range(PASSWORD_LENGTH))


@dataclass(frozen=True)
class Login:
    user: str
    password: str
    password_hash: str


@dataclass
class Classroom:
    """The class's logins (the teacher first) and the login secret."""

    logins: list[Login]
    secret: str

    @property
    def students(self) -> list[Login]:
        return [login for login in self.logins if login.user != TEACHER]

    def app_env(self) -> dict[str, str]:
        """What the app needs to turn login on for this class (hashes only)."""
        return {"AUTH_USERS": ",".join(f"{login.user}:{login.password_hash}" for login in self.logins),
                "TEACHERS": TEACHER, "CHAINLIT_AUTH_SECRET": self.secret}


def _new_login(user: str) -> Login:
    password = new_password()
    return Login(user, password, hash_password(password))


def prepare(folder: Path, students: int, *, new: bool = False) -> tuple[Classroom, str]:
    """The class in `folder`: kept as it is (more students added when `students` grew), or made
    anew when there is none or `new`. Returns it and a sentence saying which."""
    if not 1 <= students <= MAX_STUDENTS:
        raise ValueError(f"--class takes 1 to {MAX_STUDENTS} students (got {students})")
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)  # passwords and the login secret: its owner's only
    path = folder / CLASS_FILE
    kept = None if new or not path.exists() else _read(path)
    if kept is None:
        classroom = Classroom([_new_login(TEACHER)] + [_new_login(student_name(n)) for n in range(1, students + 1)],
                              secrets.token_urlsafe(48))
        said = f"a new class of {students} students and a teacher"
    else:
        have = len(kept.students)
        added = [_new_login(student_name(n)) for n in range(have + 1, students + 1)]
        classroom = Classroom(kept.logins + added, kept.secret)
        said = (f"the class kept from {path} ({have} students)" if not added else
                f"the class kept from {path}, {len(added)} students added ({len(classroom.students)} now)")
        if students < have:
            said += f"; it keeps all {have} (--new-class makes a class of {students})"
    _write_private(path, json.dumps({"secret": classroom.secret, "logins": [asdict(l) for l in classroom.logins]},
                                    indent=1))
    _write_private(folder / APP_ENV_FILE, "".join(f"{k}={v}\n" for k, v in classroom.app_env().items()))
    return classroom, said


def _read(path: Path) -> Classroom | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        logins = [Login(**entry) for entry in data["logins"]]
        secret = data["secret"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is not a class this script wrote ({error}); --new-class makes a new one") from error
    if not logins or logins[0].user != TEACHER or not isinstance(secret, str) or len(secret) < 32:
        raise ValueError(f"{path} is not a class this script wrote; --new-class makes a new one")
    return Classroom(logins, secret)


def _write_private(path: Path, content: str) -> None:
    """Write a file only its owner can read (it holds passwords or the login secret)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        out.write(content)


# ---------------------------------------------------------------- where the students reach the app


def machine_addresses() -> list[str]:
    """This machine's IPv4 addresses that other machines may reach (up interfaces; no loopback or
    link-local), the one of the default route first."""
    import psutil

    stats = psutil.net_if_stats()
    found: list[tuple[int, str]] = []
    default = _default_route_interface()
    for interface, addresses in psutil.net_if_addrs().items():
        if interface in stats and not stats[interface].isup:
            continue
        for address in addresses:
            if address.family.name != "AF_INET":
                continue
            ip = ip_address(address.address)
            if ip.is_loopback or ip.is_link_local or ip.is_unspecified:
                continue
            found.append((0 if interface == default else 1, address.address))
    return [address for _, address in sorted(found)]


def _default_route_interface() -> str | None:
    try:
        for line in Path("/proc/net/route").read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) > 2 and fields[1] == "00000000":
                return fields[0]
    except OSError:
        pass
    return None


def join_urls(host: str, port: int) -> list[str]:
    """The addresses students open: every reachable address of this machine when the app listens on
    all of them, else the one it listens on."""
    if host in ("0.0.0.0", "::", ""):
        return [f"http://{address}:{port}" for address in machine_addresses()]
    shown = f"[{host}]" if ":" in host else host
    return [f"http://{shown}:{port}"]


# ---------------------------------------------------------------- the class sheet


def write_sheet(folder: Path, classroom: Classroom, join_url: str | None) -> tuple[Path, Path]:
    """The CSV (`user,password`, the teacher first) and the printable page of slips."""
    sheet, slips = folder / SHEET_FILE, folder / SLIPS_FILE
    descriptor = os.open(sheet, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["user", "password"])
        writer.writerows([login.user, login.password] for login in classroom.logins)
    _write_private(slips, slips_page(classroom, join_url))
    return sheet, slips


def _qr_svg(url: str) -> str:
    import segno

    return segno.make(url, error="m").svg_inline(scale=4, border=2, title=f"QR code of {url}")


def slips_page(classroom: Classroom, join_url: str | None) -> str:
    """One slip per student (and the teacher's, marked): the address, its QR code, user and password.
    Cut along the dashed lines."""
    address = join_url or "(no network address found: connect this machine to the room's network and run it again)"
    qr = _qr_svg(join_url) if join_url else ""

    def slip(login: Login) -> str:
        role = "Teacher" if login.user == TEACHER else "Student"
        return (f'<section class="slip{" teacher" if login.user == TEACHER else ""}">'
                f'<div class="qr">{qr}</div><div class="words"><p class="role">Serving Lab · {role}</p>'
                f'<p>Open <b class="address">{html.escape(address)}</b></p>'
                f'<p>User <b class="user">{html.escape(login.user)}</b></p>'
                f'<p>Password <b class="password">{html.escape(login.password)}</b></p></div></section>')

    students = "".join(slip(login) for login in classroom.students)
    teacher = "".join(slip(login) for login in classroom.logins if login.user == TEACHER)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Serving Lab: the class's slips</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 1cm; }}
.slips {{ display: grid; grid-template-columns: 1fr 1fr; gap: 0; }}
.slip {{ display: flex; gap: 12px; align-items: center; padding: 10px; border: 1px dashed #888;
        break-inside: avoid; page-break-inside: avoid; }}
.slip.teacher {{ border: 2px solid #000; }}
.slip p {{ margin: 2px 0; }} .role {{ font-weight: 600; }}
.password, .user, .address {{ font-family: ui-monospace, monospace; font-size: 15px; }}
.teacher-page {{ page-break-before: always; }}
</style></head><body>
<h1>Serving Lab: the class's logins</h1>
<p>Cut along the dashed lines and give each student one slip. The teacher's slip is on its own page.</p>
<div class="slips">{students}</div>
<div class="teacher-page"><div class="slips">{teacher}</div></div>
</body></html>
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m core.classroom",
        description="Make or keep the class for scripts/lab.sh --class: logins, the secret, the sheet.")
    parser.add_argument("--students", type=int, required=True, help="how many student logins (student01...)")
    parser.add_argument("--dir", type=Path, required=True, help="the class folder (kept between runs)")
    parser.add_argument("--host", default="0.0.0.0", help="the address the app listens on")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--join-url", default="", help="the address printed on the slips (default: this machine's)")
    parser.add_argument("--new", action="store_true", help="new logins and a new secret, even if a class exists")
    args = parser.parse_args(argv)
    try:
        classroom, said = prepare(args.dir, args.students, new=args.new)
    except ValueError as error:
        print(f"lab: {error}", file=sys.stderr)
        return 2
    urls = [args.join_url] if args.join_url else join_urls(args.host, args.port)
    sheet, slips = write_sheet(args.dir, classroom, urls[0] if urls else None)
    print(f"CLASS_SAID={said}")
    print(f"LAB_JOIN_URLS={' '.join(urls)}")
    print(f"LAB_CLASS_SHEET={sheet.resolve()}")
    print(f"LAB_CLASS_SLIPS={slips.resolve()}")
    print(f"LAB_CLASS_ENV={(args.dir / APP_ENV_FILE).resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
