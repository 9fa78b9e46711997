"""Rate a battle file offline: `python -m core.ratings --votes FILE [options]`.

    python -m core.ratings --votes votes.jsonl                       # Markdown, every control
    python -m core.ratings --votes votes.jsonl --control speed --category code --format json
    python -m core.ratings --votes arena.jsonl --control length,style --lang zh

FILE is this app's vote export (the leaderboard's download) or an Arena battle log converted
by `python -m core.ratings.arena_convert`. The same file, options and seed always print the same
leaderboard, so a class's votes can be rated and reproduced anywhere.
"""

from __future__ import annotations

import argparse
import json
import sys

from core.ratings import one_blas_thread

one_blas_thread()  # before numpy is imported

from core.ratings.battles import BattleFileError, BattleView, read_battles, votes_by  # noqa: E402
from core.ratings.board import board_json, board_markdown, build_board  # noqa: E402
from core.ratings.controlled import DEFAULT_CONTROLS, parse_controls  # noqa: E402
from core.ratings.ratings import BOOTSTRAP_SAMPLES, ReplyFigures  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.ratings", description=__doc__.split("\n\n")[0])
    parser.add_argument("--votes", required=True, metavar="FILE", help="a battle JSONL file")
    parser.add_argument("--control", default=",".join(DEFAULT_CONTROLS), metavar="LIST",
                        help="what to hold apart: speed, length, style (comma-separated) or none; default: all")
    parser.add_argument("--category", help="rate only the votes of this prompt category (e.g. code, free)")
    parser.add_argument("--language", help="rate only the votes in this language (zh, en)")
    parser.add_argument("--format", choices=("md", "json"), default="md", help="output format; default: md")
    parser.add_argument("--lang", choices=("en", "zh"), default="en", help="language of the words; default: en")
    parser.add_argument("--bootstrap", type=int, default=BOOTSTRAP_SAMPLES, metavar="N",
                        help=f"bootstrap samples for the 95%% intervals; default: {BOOTSTRAP_SAMPLES}")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed; default: 0")
    args = parser.parse_args(argv)
    try:
        controls = parse_controls(args.control)
    except ValueError as error:
        parser.error(str(error))
    if args.bootstrap < 1:
        parser.error(f"--bootstrap must be at least 1, got {args.bootstrap}")
    try:
        battles = read_battles(args.votes)
    except BattleFileError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    view = BattleView(args.category, args.language.lower() if args.language else None)
    for key, wanted in (("category", view.category), ("language", view.language)):
        present = [name for name, _ in votes_by(battles, key)]
        if wanted is not None and wanted not in present:
            print(f"error: no vote in {args.votes} has {key} {wanted!r}; its {key} values: {', '.join(present)}",
                  file=sys.stderr)
            return 1
    board = build_board(battles, _figures(battles), view, controls, bootstrap_samples=args.bootstrap,
                        controlled_bootstrap_samples=args.bootstrap, seed=args.seed)
    if args.format == "json":
        print(json.dumps(board_json(board, args.lang), ensure_ascii=False, indent=1))
    else:
        print(board_markdown(board, args.lang))
    return 0


def _figures(battles) -> list[ReplyFigures]:
    """Each completed reply's speed once (a reply of a 3-column round is in two or three battles)."""
    seen: dict[tuple[str, str], ReplyFigures] = {}
    for battle in battles:
        for side in (battle.a, battle.b):
            known = side.first_token_s is not None or side.decode_tokens_per_s is not None
            if known and side.status in (None, "completed"):
                seen.setdefault((battle.round_id, side.backend),
                                ReplyFigures(side.backend, side.first_token_s, side.decode_tokens_per_s))
    return list(seen.values())


if __name__ == "__main__":
    sys.exit(main())
