"""The comma lists of the `handles` commands (`--modes`, `--job NAME:VERBS`, `--only`, `--skip`): spaces
around a name are ignored, and an unknown name is refused naming the names to use instead."""

from __future__ import annotations

import pytest

from handles.cli.parser import build_parser


def test_spaces_around_the_names_of_a_comma_list_are_ignored() -> None:
    parser = build_parser()
    shown = parser.parse_args(
        ["manifest", "URL", "--modes", "inline, handles", "--job", "deploy_release:respond, cancel"]
    )
    assert shown.modes == ["inline", "handles"]
    assert shown.job == [("deploy_release", ["respond", "cancel"])]
    checked = parser.parse_args(["check", "--only", " isolation , hygiene", "--skip", "hygiene,"])
    assert (checked.only, checked.skip) == (["isolation", "hygiene"], ["hygiene"])


@pytest.mark.parametrize(
    ("arguments", "refusal"),
    [
        (["manifest", "URL", "--modes", "tasks, tusks"], "tusks: not a mode; use tasks, handles, inline"),
        (["manifest", "URL", "--job", "deploy_release:reply"], "reply: not a verb; use start, progress, "),
        (["check", "--only", "isolation, nope"], "nope: not a gate; use isolation, transitions, "),
    ],
)
def test_an_unknown_name_is_refused_with_the_names_to_use(
    arguments: list[str], refusal: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(arguments)
    assert exited.value.code == 2 and refusal in capsys.readouterr().err
