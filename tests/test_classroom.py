"""The class `lab.sh --class N` makes (core/classroom.py): logins that verify, kept between runs,
grown when the class grows, made anew only when asked; private files; the sheet and its slips."""

from __future__ import annotations

import csv
import stat
from pathlib import Path

import pytest

from core import classroom
from core.auth import auth_from_env, verify_password


@pytest.fixture(autouse=True)
def quick_hashes(monkeypatch):
    """Real PBKDF2, fewer iterations: the class is hashed the same way, faster."""
    real = classroom.hash_password
    monkeypatch.setattr(classroom, "hash_password", lambda password: real(password, iterations=1000))


def sheet_rows(folder: Path) -> list[dict[str, str]]:
    with open(folder / classroom.SHEET_FILE, newline="") as sheet:
        return list(csv.DictReader(sheet))


def test_a_new_class_has_a_teacher_and_n_students_whose_passwords_verify_and_turn_login_on(tmp_path):
    made, said = classroom.prepare(tmp_path, 3)
    assert said == "a new class of 3 students and a teacher"
    assert [login.user for login in made.logins] == ["teacher", "student01", "student02", "student03"]
    assert len({login.password for login in made.logins}) == 4
    for login in made.logins:
        assert len(login.password) == classroom.PASSWORD_LENGTH
        assert set(login.password) <= set(classroom.PASSWORD_ALPHABET)
        assert login.password not in login.password_hash
        assert verify_password(login.password, login.password_hash)
    auth = auth_from_env(made.app_env())  # what the app reads: login on, the teacher a teacher
    assert auth.enabled and auth.is_teacher("teacher") and not auth.is_teacher("student01")
    assert auth.check("student02", made.logins[2].password) and not auth.check("student02", "guess")


def test_running_again_keeps_the_class_grows_it_and_new_makes_another(tmp_path):
    first, _ = classroom.prepare(tmp_path, 2)
    again, said = classroom.prepare(tmp_path, 2)
    assert again.logins == first.logins and again.secret == first.secret
    assert said.startswith("the class kept")
    grown, said = classroom.prepare(tmp_path, 4)
    assert grown.logins[:3] == first.logins and [l.user for l in grown.logins[3:]] == ["student03", "student04"]
    assert "2 students added (4 now)" in said
    fewer, said = classroom.prepare(tmp_path, 1)
    assert fewer.logins == grown.logins and "keeps all 4 (--new-class makes a class of 1)" in said
    new, said = classroom.prepare(tmp_path, 2, new=True)
    assert said.startswith("a new class")
    assert new.secret != first.secret
    assert not {l.password for l in new.logins} & {l.password for l in grown.logins}


def test_the_class_files_are_readable_by_their_owner_only_and_the_app_gets_no_password(tmp_path):
    folder = tmp_path / "class"
    made, _ = classroom.prepare(folder, 2)
    classroom.write_sheet(folder, made, "http://192.0.2.7:8000")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name in (classroom.CLASS_FILE, classroom.APP_ENV_FILE, classroom.SHEET_FILE, classroom.SLIPS_FILE):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
    app_env = (folder / classroom.APP_ENV_FILE).read_text()
    assert "AUTH_USERS=teacher:pbkdf2_sha256$" in app_env and "TEACHERS=teacher\n" in app_env
    assert not [l.user for l in made.logins if l.password in app_env]


def test_a_damaged_class_file_is_refused_with_what_to_do(tmp_path):
    (tmp_path / classroom.CLASS_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="--new-class makes a new one"):
        classroom.prepare(tmp_path, 2)
    assert classroom.prepare(tmp_path, 2, new=True)[0].students
    with pytest.raises(ValueError, match="1 to 200"):
        classroom.prepare(tmp_path, 0)


def test_the_sheet_lists_every_login_and_each_slip_has_the_address_its_qr_code_user_and_password(tmp_path):
    made, _ = classroom.prepare(tmp_path, 3)
    sheet, slips = classroom.write_sheet(tmp_path, made, "http://192.0.2.7:8000")
    assert sheet_rows(tmp_path) == [{"user": l.user, "password": l.password} for l in made.logins]
    page = slips.read_text()
    assert page.count('<section class="slip') == 4 and page.count('class="slip teacher"') == 1
    assert page.count("http://192.0.2.7:8000") == 4 + 4  # each slip's text and its QR code's title
    assert page.count("<svg") == 4
    for login in made.logins:
        assert f'<b class="user">{login.user}</b>' in page and f'<b class="password">{login.password}</b>' in page
    # Without an address other machines reach, the slips say so instead of showing a QR code.
    page = classroom.slips_page(made, None)
    assert "<svg" not in page and "no network address found" in page


def test_students_are_sent_to_this_machines_reachable_addresses_never_loopback(monkeypatch):
    monkeypatch.setattr(classroom, "machine_addresses", lambda: ["192.0.2.7", "198.51.100.3"])
    assert classroom.join_urls("0.0.0.0", 8000) == ["http://192.0.2.7:8000", "http://198.51.100.3:8000"]
    assert classroom.join_urls("198.51.100.3", 8001) == ["http://198.51.100.3:8001"]
    monkeypatch.undo()
    found = classroom.machine_addresses()
    assert not [address for address in found if address.startswith("127.") or address.startswith("169.254.")]
