"""The documents cannot drift from the code: every repository path that README.md and docs/ name exists, every
`slea ...` command they show parses (its subcommand, its options, and its ``--set`` keys are real config keys),
every function and class name docs/architecture.md cites is defined in src/slea, the README's config-error demo
prints what it shows, the README's layout lists real paths and every package of src/slea, the README stays a front
door (at most 200 lines), and no document points outside the repository or carries a date, a machine load or a
commit hash in its prose."""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import importlib.util
import itertools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from slea.cli.main import app
from slea.config import ConfigError, RunConfig, build_config

# the click that typer builds its commands with (typer vendors its own copy; its usage errors are that copy's)
_click = "typer._click" if importlib.util.find_spec("typer._click") else "click"
UsageError = importlib.import_module(f"{_click}.exceptions").UsageError

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
README_MAX_LINES = 200

# Pages another engineer is rewriting right now: their known outside pointers and dated prose go when they do. A
# strict xfail fails as soon as the page is clean, so the entry must then be removed.
BEING_REWRITTEN: set[str] = set()


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def ids(paths):
    return [rel(p) for p in paths]


# -- reading a markdown page ---------------------------------------------------------------------------------------
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
URL = re.compile(r"https?://\S+")


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of every fenced block."""
    return [(m.group(1).strip(), m.group(2)) for m in FENCE.finditer(text)]


def prose(text: str) -> str:
    """The page without fenced blocks, inline code, link targets and URLs: what a reader reads as sentences."""
    text = FENCE.sub("", text)
    text = INLINE.sub("", text)
    text = LINK.sub("", text)
    return URL.sub("", text)


# -- repository paths ----------------------------------------------------------------------------------------------
TOP = ("src", "docs", "tests", "bench", "experiments", "configs")
# a path that starts at a top-level folder of the repository, or a slea/... source file (docs shorten src/slea/)
REPO_PATH = re.compile(r"(?<![\w./~$-])((?:{})/[\w./-]*|slea/[\w/]+\.py)".format("|".join(TOP)))


def _clean(path: str) -> str:
    path = path.split("..")[0] if ".." in path[1:] else path  # "kernel_old1..4": a range, its stem must exist
    return path.rstrip(".,:;")


def repo_paths(text: str) -> set[str]:
    """Every repository path a page names, in prose, inline code or code blocks: a file (its last part has an
    extension) or a folder written with its trailing slash; a bare stem (``--out bench/results/x``) is an output
    name, not a path. A path followed by a placeholder (``<env>``, ``*``, ``{a,b}``) is checked up to its folder."""
    found = set()
    text = URL.sub("", text)
    for m in REPO_PATH.finditer(text):
        path = _clean(m.group(1))
        if text[m.end(1):m.end(1) + 1] in ("<", "*", "{", "$"):
            path = path.rsplit("/", 1)[0] + "/"
        elif not (path.endswith("/") or "." in path.rsplit("/", 1)[-1]):
            continue
        found.add(path)
    return found


def resolve(path: str) -> Path:
    return ROOT / "src" / path if path.startswith("slea/") else ROOT / path


@pytest.mark.parametrize("doc", DOCS, ids=ids(DOCS))
def test_every_repository_path_a_document_names_exists(doc):
    missing = sorted(p for p in repo_paths(doc.read_text()) if not resolve(p).exists())
    assert not missing, f"{rel(doc)} names paths that do not exist: {missing}"


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return s.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    text = FENCE.sub("", doc.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.MULTILINE)}


@pytest.mark.parametrize("doc", DOCS, ids=ids(DOCS))
def test_every_relative_link_resolves_to_a_file_and_heading(doc):
    bad = []
    for target in LINK.findall(FENCE.sub("", doc.read_text())):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists() or anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(target)
    assert not bad, f"{rel(doc)}: links to missing files or headings: {bad}"


def test_the_path_reader_finds_paths_and_flags_missing_ones():
    text = ("see `experiments/results/align/<env>/table.md`, docs/architecture.md. and [x](docs/nope.md), "
            "`slea/policy/model.py::load_policy`, env `slea/TextWorld-v0`, https://x.org/docs/a.md, tests/test_*.py, "
            "--out bench/results/stem, 58 docs/s")
    assert repo_paths(text) == {"experiments/results/align/", "docs/architecture.md", "docs/nope.md",
                                "slea/policy/model.py", "tests/"}
    assert not resolve("docs/nope.md").exists() and resolve("slea/policy/model.py").exists()
    assert slug("Sharded base weights: `train.fsdp`") == "sharded-base-weights-trainfsdp"


# -- code names a page cites ------------------------------------------------------------------------------------
CODE_NAMED = [ROOT / "docs" / "architecture.md"]  # the pages that cite functions and classes by name
SRC = ROOT / "src" / "slea"
# Names a page writes as code that are values, not definitions: each with what it is.
NOT_CODE = {
    "low_var_kl": "a value of algorithm.kl_estimator (verl's name for k3)",
    "offline_data": "a value of AlgorithmSpec.needs (a string in NEEDS)",
    "admissible_actions": "a key of an env's info dict",
}
FILE_SUFFIXES = {"yaml", "yml", "json", "jsonl", "png", "sqlite", "md", "py", "html", "txt", "toml", "safetensors"}
CODE_SPAN = re.compile(r"`([^`]+)`")  # inline code, which may wrap onto the next line
DOTTED = re.compile(r"\.?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")  # a span that is a (dotted) name and nothing else
CALLED = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\(")  # every name(...) inside a span


def defined_names(src: Path = SRC) -> tuple[set[str], set[str]]:
    """(what src defines, the outside top-level modules it imports), read with ``ast``, nothing imported.

    Defined: every module and package name, function, method and class; every name an assignment binds at any
    level (module constants, dataclass and pydantic fields, ``self.x = ...`` attributes); every keyword-only
    parameter (an estimator's or a loss's settings, which the docs cite by name)."""
    names: set[str] = set()
    outside: set[str] = set()
    for path in src.rglob("*.py"):
        names.update(part.removesuffix(".py") for part in path.relative_to(src).parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                if not isinstance(node, ast.ClassDef):
                    names.update(a.arg for a in node.args.kwonlyargs)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    for n in ast.walk(target):
                        if isinstance(n, ast.Name):
                            names.add(n.id)
                        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) \
                                and n.value.id in ("self", "cls"):
                            names.add(n.attr)
            elif isinstance(node, ast.Import):
                outside.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                outside.add(node.module.split(".")[0])
    outside.discard("slea")
    return names, outside


def looks_like_code(part: str) -> bool:
    """With an underscore (``load_config``, ``_parse``, ``TRAIN_SALT``) or CamelCase (``TextEnv``, ``Critic``)."""
    return re.search(r"\w_|_\w", part) is not None or re.match(r"^[A-Z][a-z]", part) is not None


def cited_names(text: str) -> set[str]:
    """The function and class names a page's inline code cites: a span that is a (dotted) name that looks like
    code (``Trainer.fit``, ``config.load_config``, ``fill_old_and_reference``), and every ``name(`` in a span
    (``estimate(spec, batch, ...)``). Skipped: a config key (``algorithm.old_logprobs``: its first part is a
    config section), a metric name or path (a slash), a file (``config.yaml``), an outside library's name
    (``torch.multinomial``: its first part is a module slea imports) and a Python builtin (``OSError``)."""
    sections = set(RunConfig.model_fields)
    _, outside = _defined()
    found = set()
    for span in CODE_SPAN.findall(FENCE.sub("", text)):
        span = " ".join(span.split())
        if "/" in span:
            continue
        whole = DOTTED.fullmatch(span.strip())
        candidates = {(whole.group(1), False)} if whole else set()
        candidates |= {(name, True) for name in CALLED.findall(span)}
        for name, called in candidates:
            parts = name.split(".")
            if len(parts) > 1 and (parts[0] in sections or parts[-1] in FILE_SUFFIXES) or parts[0] in outside \
                    or hasattr(builtins, parts[0]):
                continue
            if called or any(looks_like_code(p) for p in parts):
                found.add(name)
    return found


@functools.cache
def _defined() -> tuple[set[str], set[str]]:
    return defined_names()


def undefined_names(text: str) -> list[str]:
    """The cited names whose last part src/slea does not define (``Trainer.fit``: ``fit``)."""
    names, _ = _defined()
    return sorted(n for n in cited_names(text) if n.split(".")[-1] not in names and n not in NOT_CODE)


@pytest.mark.parametrize("doc", CODE_NAMED, ids=ids(CODE_NAMED))
def test_every_function_and_class_a_page_names_is_defined_in_src(doc):
    missing = undefined_names(doc.read_text())
    assert not missing, f"{rel(doc)} names code that src/slea does not define: {missing}"


def test_the_name_checker_catches_a_made_up_name():
    text = ("`Trainer.fit` → `fill_old_and_reference` → `made_up_logprobs(model)`, `NoSuchTrainer`, "
            "`config.load_config`, `algorithm.old_logprobs`, `rollout/entropy`, `config.yaml`, `torch.multinomial`, "
            "`OSError`, `low_var_kl`, a `grpo` step")
    assert cited_names(text) == {"Trainer.fit", "fill_old_and_reference", "made_up_logprobs", "NoSuchTrainer",
                                 "config.load_config", "low_var_kl"}
    assert undefined_names(text) == ["NoSuchTrainer", "made_up_logprobs"]
    assert undefined_names("`_check_options` checks `algorithm.options`") == ["_check_options"]


# -- slea commands -------------------------------------------------------------------------------------------------
def _logical_lines(body: str) -> list[str]:
    out, cur = [], ""
    for line in body.splitlines():
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        out.append(cur + line)
        cur = ""
    if cur:
        out.append(cur)
    return out


PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")  # RUN, ID, N: a value a reader fills in


def _command(line: str) -> list[str] | None:
    """The argument list of a line that runs ``slea``, or None. A leading ``$ ``, ``.venv/bin/``, env
    assignments, a trailing comment and ``&`` are dropped; ``[...]`` (optional parts of a synopsis) and ``...``
    are removed; a placeholder (``RUN``, ``N``) becomes ``1``, a value every option accepts. A diagram line
    (arrows) is not a command."""
    line = line.strip().removeprefix("$ ").strip()
    if re.search(r"[─►→]", line):
        return None
    line = re.sub(r"\s#\s.*$", "", line)
    line = re.sub(r"\s*&$", "", line)
    line = re.sub(r"\[[^\[\]]*\]", "", re.sub(r"\[[^\[\]]*\]", "", line))  # nested once
    try:
        words = shlex.split(line)
    except ValueError:
        return None
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words = words[1:]
    if not words or words[0] not in ("slea", ".venv/bin/slea"):
        return None
    return ["1" if PLACEHOLDER.match(w) else w for w in words[1:] if w != "..."]


def commands(doc: Path) -> list[tuple[list[str], str, bool]]:
    """(args, the line as shown, whole) of every slea command in a page: a code block's line is a whole command;
    inline code in a sentence may name a command without its arguments (`slea eval`, `slea train --resume`)."""
    text = doc.read_text()
    found = []
    for _, body in code_blocks(text):
        for line in _logical_lines(body):
            args = _command(line)
            if args is not None:
                found.append((args, line.strip(), True))
    for span in INLINE.findall(FENCE.sub("", text)):
        if span.startswith("slea "):
            args = _command(span)
            if args is not None:
                found.append((args, span, False))
    return found


ALL_COMMANDS = [(rel(d), args, shown, whole) for d in DOCS for args, shown, whole in commands(d)]


def parse(args: list[str]):
    """Parse a command line as ``slea`` would, without running it: unknown subcommands and options, missing
    arguments and bad option values raise click's usage errors."""
    group = typer.main.get_command(app)
    ctx = group.context_class(group, info_name="slea")
    cmd, rest = group, list(args)
    while hasattr(cmd, "list_commands"):  # a command group
        assert rest, "a command group without its subcommand"
        names = rest.pop(0).split("|")  # "library show|search" in a sentence: each one must exist
        subs = [cmd.get_command(ctx, n) for n in names]
        unknown = [n for n, s in zip(names, subs, strict=True) if s is None]
        assert not unknown, f"unknown subcommand {unknown} of {cmd.name}"
        if len(subs) > 1:
            return ctx
        cmd = subs[0]
        if not hasattr(cmd, "list_commands"):
            return cmd.make_context(names[0], list(rest), parent=ctx)
    return ctx


def config_key_exists(override: str) -> bool:
    """Whether the dotted key of ``key=value`` is a config key: the loader refuses an unknown one by name (its
    value may still be refused for other reasons, which a doc showing a placeholder value is allowed)."""
    key = override.partition("=")[0].strip()
    try:
        build_config({}, [override], check_unused=False)
    except ConfigError as err:
        msg = str(err)
        return not (msg.startswith(f"{key}: unknown key") or "is not a section" in msg
                    or re.match(rf"^{re.escape(key)}\.[\w.]*: unknown key", msg) is not None
                    or any(msg.startswith(f"{key[:i]}: unknown key") for i in
                           [m.start() for m in re.finditer(r"\.", key)]))
    return True


def overrides_of(ctx) -> list[str]:
    sets = list(ctx.params.get("set_") or [])
    for variant in ctx.params.get("variant") or []:  # slea compare --variant LABEL:KEY=VALUE,KEY=VALUE
        _label, _, settings = variant.partition(":")
        sets += [s for s in re.split(r",(?=[\w.]+=)", settings) if s]
    return sets


@pytest.mark.parametrize("doc,args,shown,whole", ALL_COMMANDS,
                         ids=[f"{d}:{' '.join(a)[:60]}" for d, a, _, _ in ALL_COMMANDS])
def test_every_slea_command_shown_parses_and_sets_real_config_keys(doc, args, shown, whole):
    if any(line.startswith("config error:") for line in _demo_outputs(doc, shown)):
        pytest.skip("a deliberately wrong command of a config-error demo (test_the_config_error_demo_...)")
    try:
        ctx = parse(args)
    except UsageError as err:
        # a sentence may name a command without its arguments; an unknown option or subcommand is still wrong
        named_only = type(err).__name__ == "MissingParameter" or "requires an argument" in err.format_message()
        if whole or not named_only:
            pytest.fail(f"{doc}: `{shown}` does not parse: {err.format_message()}")
        return
    unknown = [s for s in overrides_of(ctx) if not config_key_exists(s)]
    assert not unknown, f"{doc}: `{shown}` sets keys the config does not have: {unknown}"


def test_the_command_reader_and_the_key_check_can_fail():
    assert _command("$ .venv/bin/slea train configs/smoke.yaml --set a.b=1   # comment") == \
        ["train", "configs/smoke.yaml", "--set", "a.b=1"]
    assert _command("slea compare cfg.yaml --seeds 0 [--set train.iterations=20 ...] [--out D]") == \
        ["compare", "cfg.yaml", "--seeds", "0"]
    assert _command("make train") is None and _command("slea train cfg.yaml ─► cli.train") is None
    assert _command("slea eval RUN --episodes N") == ["eval", "1", "--episodes", "1"]
    with pytest.raises(UsageError):
        parse(["train", "--no-such-option"])
    with pytest.raises(AssertionError, match="unknown subcommand"):
        parse(["trian", "configs/smoke.yaml"])
    with pytest.raises(AssertionError, match="unknown subcommand"):
        parse(["library", "shwo", "runs/x"])
    assert config_key_exists("rollout.groups=2") and config_key_exists("env.kwargs.tasks=[a]")
    assert not config_key_exists("rollout.grups=3") and not config_key_exists("model.openai.nope=1")
    assert not config_key_exists("nosection.key=1")


# -- the README --------------------------------------------------------------------------------------------------
def test_readme_is_a_front_door_of_at_most_200_lines():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; results belong in docs/results/, benchmarks in " \
                                  f"docs/performance.md"


def readme_layout(text: str) -> list[str]:
    """The paths the first code block under ``## Layout`` lists, each line's first word: an unindented one from the
    repository root, an indented one inside the last unindented one (``src/slea/`` then ``  runs/``)."""
    _, body = code_blocks(text.split("\n## Layout\n", 1)[1])[0]
    paths, parent = [], ""
    for line in body.splitlines():
        if not line.strip():
            continue
        word = line.split()[0]
        if line[0].isspace():
            paths.append(parent + word)
        else:
            parent = word
            paths.append(word)
    return paths


def layout_problems(paths: list[str], root: Path = ROOT) -> tuple[list[str], list[str]]:
    """(listed paths that do not exist, a folder written with its slash that is not a folder included; packages
    directly under src/slea/ that the layout does not list)."""
    missing = [p for p in paths if not (root / p).exists() or p.endswith("/") and not (root / p).is_dir()]
    listed = {p.rstrip("/") for p in paths}
    unlisted = [f"src/slea/{d.name}/" for d in sorted((root / "src" / "slea").iterdir())
                if (d / "__init__.py").is_file() and f"src/slea/{d.name}" not in listed]
    return missing, unlisted


def test_the_readme_layout_lists_real_paths_and_every_package():
    paths = readme_layout((ROOT / "README.md").read_text())
    missing, unlisted = layout_problems(paths)
    assert not missing, f"README.md's layout lists paths that do not exist: {missing}"
    assert not unlisted, f"README.md's layout leaves out packages of src/slea: {unlisted}"


def test_the_layout_check_catches_a_missing_path_and_an_unlisted_package():
    text = "# x\n\n## Layout\n\n```\nsrc/slea/\n  trainer/   the loop\n  nosuch/    gone\n  compare.py/  a file\n" \
           "docs/      guides\n```\n"
    paths = readme_layout(text)
    assert paths == ["src/slea/", "src/slea/trainer/", "src/slea/nosuch/", "src/slea/compare.py/", "docs/"]
    missing, unlisted = layout_problems(paths)
    assert missing == ["src/slea/nosuch/", "src/slea/compare.py/"]
    assert "src/slea/runs/" in unlisted and "src/slea/trainer/" not in unlisted


def _demo_outputs(doc: str, shown: str) -> list[str]:
    """The output lines shown right under ``$ <shown>`` in a code block of ``doc``."""
    text = (ROOT / doc).read_text()
    for _, body in code_blocks(text):
        lines = body.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("$ ") and line.strip() == shown:
                out = []
                for nxt in lines[i + 1:]:
                    if nxt.startswith("$ "):
                        break
                    out.append(nxt)
                return out
    return []


def config_error_demo() -> list[tuple[list[str], str]]:
    """(args, the shown error line) of every ``$ slea ...`` line of the README followed by ``config error:``."""
    out = []
    for _, body in code_blocks((ROOT / "README.md").read_text()):
        lines = body.splitlines()
        for line, nxt in itertools.pairwise(lines):
            if line.startswith("$ slea ") and nxt.startswith("config error:"):
                out.append((_command(line), nxt))
    return out


def test_the_config_error_demo_prints_what_the_readme_shows():
    demo = config_error_demo()
    assert len(demo) >= 3, "the README keeps its config-error demo"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    for args, shown in demo:
        r = subprocess.run([sys.executable, "-m", "slea.cli", *args], cwd=ROOT, capture_output=True, text=True,
                           env=env, timeout=300, check=False)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.returncode == 2 and len(lines) == 1, (args, r.returncode, r.stderr[-2000:])
        expected = shown.removesuffix("...").rstrip()  # a shown line may end in "..." where the list goes on
        assert lines[0].startswith(expected), (lines[0], shown)


def test_the_plugin_example_in_the_readme_is_the_tested_plugin_estimator():
    """The README's `sign_grpo` is tests/plugins/my_slea_plugin.py's estimator, which tests/test_plugins.py trains."""
    readme = (ROOT / "README.md").read_text()
    block = next(b for info, b in code_blocks(readme) if info == "python" and "register_algorithm" in b)
    plugin = (ROOT / "tests/plugins/my_slea_plugin.py").read_text()
    for line in ("ret = np.bincount(rows.traj, weights=batch.rewards, minlength=rows.n_traj)",
                 "mean = np.bincount(rows.traj_group, weights=ret) / np.bincount(rows.traj_group)",
                 "centred = ret - mean[rows.traj_group]"):
        assert line in block and line in plugin, line


# -- what a document must not say ----------------------------------------------------------------------------------
OUTSIDE = re.compile(r"\.\./shared|shared/bin|shared/reference|\breference/[\w.-]+\.md|\b[Ii]ssue \d+|/w[o]rk/")
DATED = re.compile(r"\b20\d\d-\d\d-\d\d\b|load average|\bcommit [0-9a-f]{7,40}\b")


def _xfail_if_being_rewritten(doc: Path):
    if rel(doc) in BEING_REWRITTEN:
        return pytest.param(doc, id=rel(doc), marks=pytest.mark.xfail(
            strict=True, reason="being rewritten by its owner; remove it from BEING_REWRITTEN once clean"))
    return pytest.param(doc, id=rel(doc))


@pytest.mark.parametrize("doc", [_xfail_if_being_rewritten(d) for d in DOCS])
def test_no_document_points_outside_the_repository(doc):
    hits = sorted({m.group(0) for m in OUTSIDE.finditer(URL.sub("", doc.read_text()))})
    assert not hits, f"{rel(doc)} points outside the repository: {hits}"


@pytest.mark.parametrize("doc", [_xfail_if_being_rewritten(d) for d in DOCS])
def test_no_document_dates_its_prose_or_records_machine_load_or_commits(doc):
    hits = sorted({m.group(0) for m in DATED.finditer(prose(doc.read_text()))})
    assert not hits, f"{rel(doc)}: measurement conditions belong in the result JSON, not in prose: {hits}"


CODE = sorted(p for d in ("src", "experiments", "bench", "configs", "tests", ".ci") for p in (ROOT / d).rglob("*")
              if p.is_file() and p.suffix in (".py", ".yaml", ".yml", ".toml", ".sh", "") and p.name != "test_docs.py"
              and "__pycache__" not in p.parts) + [ROOT / "Makefile", ROOT / "pyproject.toml"]


def test_no_code_or_config_points_outside_the_repository():
    hits = {rel(p): sorted({m.group(0) for m in OUTSIDE.finditer(p.read_text(errors="replace"))}) for p in CODE}
    assert not {k: v for k, v in hits.items() if v}


def test_the_forbidden_patterns_catch_what_they_are_for():
    assert OUTSIDE.search("through `../shared/bin/heavy`") and OUTSIDE.search("reference/papers.md §3")
    assert OUTSIDE.search("still open in issue 11") and not OUTSIDE.search("the reference model's log-probs")
    assert DATED.search(prose("measured on 2026-12-01, load average 1.9")) and DATED.search("commit 709ef77")
    assert not DATED.search(prose("files in `experiments/results/default_job/2026-11-30_global_prompt/`"))
