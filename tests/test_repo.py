"""The repository's own promises: README's first two commands, CI calling the second, one
version everywhere."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _readme_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_ci_runs_the_readme_test_command():
    main_job, test_cmd = _readme_commands()[:2]
    assert "nox -s tests" in test_cmd and main_job != test_cmd
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_cmd in [line.strip() for line in ci]


def test_main_job_is_the_release_of_this_version():
    """The README's first command releases the whole set, of the version in version.txt."""
    main_job = _readme_commands()[0]
    assert main_job.startswith("python3 -m pip install -q nox && ")
    assert main_job.endswith('nox -s release -- "$(cat version.txt)"')


def test_readme_has_install_and_release_sections():
    text = (ROOT / "README.md").read_text()
    install = text.split("## Install", 1)[1].split("\n## ", 1)[0]
    assert "'flashinfer-python[jit-cache]==X.Y.Z'" in install and "/cu130/" in install
    release = text.split("## Release", 1)[1].split("\n## ", 1)[0]
    assert "nox -s release -- X.Y.Z" in release


def test_one_version():
    version = (ROOT / "version.txt").read_text().strip()
    assert re.fullmatch(r"\d+\.\d+\.\d+([.-]?\w+)?", version)
    for pyproject in ROOT.glob("packages/*/pyproject.toml"):
        assert 'dynamic = ["version"' in pyproject.read_text(), pyproject
        assert version not in pyproject.read_text(), f"{pyproject} spells the version"


def test_tuning_switches_exist():
    """Every FLASHINFER_ATTENTION_* macro that benchmarks/tuning/tune_attention.py compiles a variant
    with is read somewhere in the attention sources (a misspelt one would build the default
    kernel under another name and compare it with itself)."""
    tune = (ROOT / "benchmarks" / "tuning" / "tune_attention.py").read_text()
    variants = tune.split("VARIANTS = {", 1)[1].split("\n}", 1)[0]
    switches = set(re.findall(r'"([A-Z0-9_]+)=[^"]*"', variants))
    assert len(switches) >= 5  # the parse found the list (numeric parameters and probes)
    pkg = ROOT / "packages" / "flashinfer-python"
    sources = "".join(p.read_text() for d in ("include", "csrc") for p in (pkg / d).rglob("*")
                      if p.suffix in (".cuh", ".cu", ".h"))
    read = set(re.findall(r"#\s*(?:ifndef|ifdef|if|elif)\b[^\n]*?FLASHINFER_ATTENTION_(\w+)",
                          sources))
    assert switches <= read, f"not read by any source: {sorted(switches - read)}"


def test_release_section_says_where_users_download_from():
    """The public repositories are configured once, in a declared knob, and documented where
    the release is; without them the release is local-only, and the README says so."""
    from flashinfer import knobs

    release = (ROOT / "README.md").read_text().split("## Release", 1)[1].split("\n## ", 1)[0]
    assert "FLASHINFER_PUBLIC_REPOSITORIES" in release and "local-only" in release
    assert "FLASHINFER_PUBLIC_REPOSITORIES" in knobs.all_env_vars()
    assert "git add artifacts/releases/X.Y.Z.json version.txt" in release
