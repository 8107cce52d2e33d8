"""slea/trainer/team_settings.py states what the team trainer reads; these tests hold it to the code. The team's own
modules (trainer/team.py, team_checkpoint.py, evaluation/team.py, slea/team/) are scanned (ast) for every setting they
read (``cfg.<section>.<key>``, through the names they give a config or a section: ``t = cfg.team``, ``self.cfg``,
a ``model_cfg`` or ``rollout_cfg`` parameter) and for every section they hand on whole: a read that is not declared
fails here, and so does a section handed to a callee no test has looked at. What a callee outside the team's modules
reads is declared with that module, which must name it."""

from __future__ import annotations

import ast
from pathlib import Path

from pydantic import BaseModel

import slea
from slea.config import RunConfig
from slea.trainer.team_settings import DOES, INSTEAD, READS

SRC = Path(slea.__file__).parent
TEAM_MODULES = ["trainer/team.py", "trainer/team_checkpoint.py", "evaluation/team.py",
                *sorted(str(p.relative_to(SRC)) for p in (SRC / "team").glob("*.py"))]
# the names a config or one of its sections goes by in the team's modules ("": the whole config)
NAMES = {"cfg": "", "model_cfg": "model", "rollout_cfg": "rollout"}
# settings the team trainer's own check (check_team_config) reads only to refuse any value but their default; the
# config check refuses them when the config loads (tests/config/test_team_settings.py)
REFUSED_BY_ITS_CHECK = {"algorithm.kl_coef", "algorithm.dynamic_sampling", "experience.mode"}
# the config and the sections the team's modules hand on whole, and who reads what of them (stated by hand: a new
# one fails the test until its callee's reads are declared)
HANDED_ON = {
    "": "RunState, budgets and lifecycle (run.name, dir; train.save_every, budgets, max_bad_updates; env.max_fault_rate; "
        "eval.before), evaluate_team (scanned here), check_team_config (scanned), RunLog's config record",
    "algorithm": "estimator_settings and loss_settings: the estimator's and the policy loss's own parameters",
    "env": "make_pool and eval_env_kwargs (envs/factory.py)",
    "model": "build_team_policy (scanned), load_policy and lora_config (policy/model.py), make_generator "
             "(policy/engines.py)",
    "rollout": "TeamCollector (scanned: team/rollout.py)",
    "team.trust_region": "TrustRegion(**model_dump()): every key",
}


def _section(path: str) -> type[BaseModel] | None:
    """The section class at ``path`` ('' the config), or None when ``path`` is a setting."""
    cls: type[BaseModel] = RunConfig
    for part in path.split(".") if path else []:
        ann = cls.model_fields[part].annotation
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        cls = ann
    return cls


def _field(base: str, attr: str) -> str | None:
    cls = _section(base)
    if cls is None or attr not in cls.model_fields:
        return None
    return f"{base}.{attr}" if base else attr


def scan(path: Path) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """``(function, setting)`` for every setting the module at ``path`` reads, and ``(function, section)`` for
    every section (or the config, '') it uses whole: hands to a call, or dumps."""
    tree = ast.parse(path.read_text())
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    parent = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
    on_self: dict[str, str] = {}  # self.<attr> -> what it holds
    local: dict[ast.AST, dict[str, str]] = {fn: {} for fn in funcs}

    def resolve(node: ast.AST, names: dict[str, str]) -> str | None:
        if isinstance(node, ast.Name):
            return names.get(node.id, NAMES.get(node.id))
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                return on_self.get(node.attr)
            base = resolve(node.value, names)
            return None if base is None else _field(base, node.attr)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
            base = resolve(node.args[0], names)
            return None if base is None else _field(base, str(node.args[1].value))
        return None

    aliased: set[ast.AST] = set()  # right-hand sides that only name a section (t = cfg.team)
    for _ in range(3):  # to a fixed point: an alias of an alias, self.cfg set in one method, read in another
        for fn in funcs:
            for n in ast.walk(fn):
                if not (isinstance(n, ast.Assign) and len(n.targets) == 1):
                    continue
                p, target = resolve(n.value, local[fn]), n.targets[0]
                if p is None:
                    continue
                aliased.add(n.value)
                if isinstance(target, ast.Name):
                    local[fn][target.id] = p
                elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                    on_self[target.attr] = p
    reads, whole = set(), set()
    for fn in funcs:
        for n in ast.walk(fn):
            if isinstance(getattr(n, "ctx", None), ast.Store) or n in aliased:
                continue
            p = resolve(n, local[fn])
            if p is None:
                continue
            up = parent.get(n)
            inner = isinstance(up, ast.Attribute) or (isinstance(up, ast.Call) and isinstance(up.func, ast.Name)
                                                       and up.func.id == "getattr" and up.args[0] is n)
            if inner and resolve(up, local[fn]) is not None:
                continue  # part of a longer read
            (reads if _section(p) is None else whole).add((fn.name, p))
    return reads, whole


def _scanned() -> tuple[dict[str, set[tuple[str, str]]], dict[str, set[tuple[str, str]]]]:
    out = {m: scan(SRC / m) for m in TEAM_MODULES}
    return {m: r for m, (r, _) in out.items()}, {m: w for m, (_, w) in out.items()}


def _declared(setting: str) -> bool:
    parts = setting.split(".")
    return any(".".join(parts[:n]) in READS for n in range(1, len(parts) + 1))


def _leaves(path: str) -> list[str]:
    cls = _section(path)
    if cls is None:
        return [path]
    return [leaf for k in cls.model_fields for leaf in _leaves(f"{path}.{k}")]


def test_the_scan_finds_reads_through_each_kind_of_name():
    reads, whole = _scanned()
    found = {s for r in reads.values() for _, s in r}
    assert {"team.context_messages",  # t = cfg.team; t.context_messages
            "eval.games",  # ev = cfg.eval; ev.games
            "rollout.top_p",  # self.cfg = rollout_cfg; self.cfg.top_p
            "model.base_dtype",  # a model_cfg parameter
            "algorithm.skip_zero_advantage",  # self.cfg = cfg; self.cfg.algorithm.skip_zero_advantage
            "team.trust_region.kl_estimator"} <= found
    assert ("__init__", "team.trust_region") in whole["trainer/team.py"]  # model_dump()


def test_every_setting_the_team_modules_read_is_declared():
    reads, _ = _scanned()
    undeclared = {(m, fn, s) for m, r in reads.items() for fn, s in r if not _declared(s)}
    # but those its own check reads to refuse them (and only there)
    assert {s for _, _, s in undeclared} == REFUSED_BY_ITS_CHECK
    assert {(m, fn) for m, fn, _ in undeclared} == {("trainer/team.py", "check_team_config")}
    assert not REFUSED_BY_ITS_CHECK & set(DOES) and REFUSED_BY_ITS_CHECK <= set(INSTEAD)


def test_every_section_handed_on_whole_is_one_whose_callees_are_declared():
    _, whole = _scanned()
    assert {s for w in whole.values() for _, s in w} == set(HANDED_ON)


def test_each_declared_setting_is_read_where_its_declaration_says():
    """A setting declared as read by one of the team's modules is found there by the scan (a declared section: every
    key in it, or the section read whole); one declared as read by a callee is named in that module's source."""
    reads, whole = _scanned()
    for setting, module in READS.items():
        assert _field(*setting.rpartition(".")[::2]), setting  # a setting or a section of the schema
        if module in reads:
            found = {s for _, s in reads[module]} | {s for _, s in whole[module]}
            for leaf in _leaves(setting):
                parts = leaf.split(".")
                assert any(".".join(parts[:n]) in found for n in range(1, len(parts) + 1)), (setting, leaf, module)
        else:
            assert setting.rsplit(".", 1)[-1] in (SRC / module).read_text(), (setting, module)


def test_the_hints_and_fixed_values_are_settings_the_team_trainer_does_not_read():
    for setting in [*INSTEAD, *DOES]:
        assert _field(*setting.rpartition(".")[::2]) and _section(setting) is None, setting
        assert not _declared(setting), setting
