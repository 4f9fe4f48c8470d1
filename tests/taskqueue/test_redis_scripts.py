"""The Redis scripts live in gorge/taskqueue/lua/: every file is loaded, every
part a script names exists, and no Lua is left in the Python modules."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import gorge.taskqueue
from gorge.taskqueue.redis_scripts import load_scripts, script_names, script_source
from gorge.taskqueue.report_rule import verdict_table

PACKAGE = Path(gorge.taskqueue.__file__).parent
LUA = PACKAGE / "lua"
PARTS_LINE = re.compile(r"^--! parts: (.*)$", re.MULTILINE)


def test_every_script_file_is_loaded():
    files = {p.stem for p in LUA.glob("*.lua")}
    assert files == set(script_names())
    scripts = load_scripts()
    for name in script_names():
        assert getattr(scripts, name).source == script_source(name)


def test_every_part_is_used_and_every_named_part_exists():
    named = set()
    for path in LUA.glob("*.lua"):
        for line in PARTS_LINE.findall(path.read_text()):
            named.update(line.split())
    assert named == {p.stem for p in (LUA / "parts").glob("*.lua")}


def test_the_rule_table_is_filled_in():
    sources = [script_source(name) for name in script_names()]
    assert not any("@REPORT_RULE@" in source for source in sources)
    table = json.dumps(verdict_table(), sort_keys=True)
    for name in ("archive", "fail_temporary", "yield_task", "report"):
        assert table in script_source(name)


def test_no_lua_source_in_python():
    lua_words = re.compile(r"redis\.call|cjson\.|\blocal \w+ =|\bend\n")
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not lua_words.search(node.value), (path.name, node.value[:60])
