"""``rh3dgs COMMAND --help`` is help: short, one line per option, one default each, no rst markup.

The options are the config dataclasses' fields and their help the fields' docstrings (tyro), so the
docstrings are bounded here too: at most 3 source lines each, the reasoning behind a default being
docs/method.md's "Choices". Lengths are measured at 80 columns (the narrow terminal, where tyro wraps most
options onto a second line). ``rh3dgs lift --help`` leaves its tuning to ``--help-all`` (cli.BRIEF_HELP).
"""
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rh3dgs.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = 80
SCREEN = 60  # lines
MARKUP = re.compile(r"``|:(?:func|class|meth|mod|data|attr|obj|ref|doc):`")
SEP = "\n=== rh3dgs help of: "
_PRINT_HELPS = f"""
import sys
from rh3dgs.cli import COMMANDS, main
for command, flag in [("", "--help"), *((c, "--help") for c in COMMANDS), ("lift", "--help-all")]:
    sys.stdout.write({SEP!r} + command + flag.replace("--help", "") + "\\n")
    try:
        main([*([command] if command else []), flag])
    except SystemExit as exc:
        assert exc.code == 0, (command, exc.code)
"""


@pytest.fixture(scope="module")
def helps():
    """``rh3dgs COMMAND --help`` of every command as a terminal of COLUMNS columns shows it (tyro's boxes),
    from one process: {command: text}."""
    env = {"COLUMNS": str(COLUMNS), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": "utf-8"}
    p = subprocess.run([sys.executable, "-c", _PRINT_HELPS], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    parts = p.stdout.split(SEP)[1:]
    return {part.split("\n", 1)[0]: part.split("\n", 1)[1] for part in parts}


def _screen_lines(text: str) -> int:
    """Lines on a terminal of COLUMNS columns (tyro wraps its boxes, not the usage line or the description)."""
    return sum(max(1, -(-len(line) // COLUMNS)) for line in text.splitlines())


def _entries(text: str):
    """The option entries of tyro's help (boxed on a terminal, plain otherwise): each flag's or positional's
    lines joined into one string."""
    entries = []
    for line in text.splitlines():
        body = line.replace("│", " ").rstrip()
        indent = len(body) - len(body.lstrip())
        if indent <= 3 and re.match(r"(-|[A-Z][A-Z_]*\s)", body.lstrip()):
            entries.append(body.strip())
        elif entries and indent > 3 and body.strip() and not body.lstrip().startswith(("•", "─", "-" * 3)):
            entries[-1] += " " + body.strip()
        elif not body.strip() or indent <= 1:
            entries.append("") if entries and entries[-1] else None
    return [e for e in entries if e]


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_fits_two_screens_and_reads_right(command, helps):
    text = helps[command]
    assert _screen_lines(text) <= 2 * SCREEN, f"rh3dgs {command} --help: {_screen_lines(text)} lines"
    assert not MARKUP.search(text), MARKUP.search(text).group(0)
    entries = _entries(text)
    assert entries, text
    for entry in entries:
        # one default per option; booleans say on / off (--no-vcd's default is "on", never "True")
        assert entry.count("default") <= 1, entry
        assert "(default: True)" not in entry and "(default: False)" not in entry, entry


def test_lift_help_is_at_most_120_lines(helps):
    text = helps["lift"]
    assert _screen_lines(text) <= 120
    flags = dict((e.split()[0], e) for e in _entries(text))
    assert "(default: on)" in flags["--no-vcd"] and "(default: off)" in flags["--overwrite"]
    assert "(default: 0.2)" in flags["--delta"]
    assert text.rstrip().endswith("rh3dgs lift --help-all"), text[-300:]


def test_lift_help_all_lists_every_option_and_both_parse_them(helps):
    """--help-all lists what --help leaves out (every field of BRIEF_HELP's dataclasses); both help texts come
    from the same parser, so a hidden option still parses."""
    import dataclasses

    from rh3dgs.cli import BRIEF_HELP, parse

    brief, full = helps["lift"], helps["lift-all"]
    hidden, _ = BRIEF_HELP["lift"]
    for cls, names in hidden.items():
        fields = {f.name for f in dataclasses.fields(cls)}
        assert set(names) <= fields, set(names) - fields  # the table names real fields
    for flag in ["--fill-neighbors", "--max-batch-gaussians", "--vcd.edge-radius", "--crop-overlap", "--batch-size"]:
        assert flag not in brief and flag in full, flag
    assert _screen_lines(full) > _screen_lines(brief) + 60 and not MARKUP.search(full)
    cmd = parse(["lift", "s.ply", "--data", "d", "--output", "o", "--fill-neighbors", "8", "--vcd.edge-radius", "2",
                 "--crop-overlap", "0.25"]).command
    assert (cmd.lift.fill_neighbors, cmd.lift.vcd.edge_radius, cmd.teacher.crop_overlap) == (8, 2, 0.25)


def _dataclass_field_docstrings():
    for path in sorted((ROOT / "rh3dgs").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in node.decorator_list)):
                continue
            for field, doc in zip(node.body, node.body[1:]):
                if (isinstance(field, ast.AnnAssign) and isinstance(doc, ast.Expr)
                        and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
                    yield f"{path.relative_to(ROOT)}:{doc.lineno} {node.name}.{field.target.id}", doc


def test_no_config_field_docstring_is_over_three_lines():
    docs = list(_dataclass_field_docstrings())
    assert len(docs) > 150  # the walk finds the config dataclasses
    long = [name for name, doc in docs if doc.end_lineno - doc.lineno + 1 > 3]
    assert not long, long
