"""The ``flashinfer`` command line (also ``python -m flashinfer``).

Every command works on a machine without a GPU or nvcc: ``show-config`` prints each section on
its own, and a section that fails prints its error instead of stopping the others.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Callable, Iterable, List, Optional

import click

from . import knobs

DISTRIBUTIONS = ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache", "apache-tvm-ffi")

# module-status --filter: which statuses each choice keeps. "compiled" means usable now without
# compiling (an AOT module is compiled), "jit" means provided by the JIT rather than a wheel.
STATUS_FILTERS = {
    "all": {"aot", "compiled", "not-compiled"},
    "aot": {"aot"},
    "jit": {"compiled", "not-compiled"},
    "compiled": {"aot", "compiled"},
    "not-compiled": {"not-compiled"},
}


def _jit_core():
    """flashinfer.jit.core, imported on first use (it is only needed by some sections)."""
    from .jit import core

    return core


def _aot():
    """flashinfer.aot (the registered modules), imported on first use."""
    from . import aot

    return aot


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _section(title: str, body: Callable[[], Iterable[str]]) -> None:
    """Print one show-config section; an exception becomes the section's last line."""
    click.echo(f"=== {title} ===")
    try:
        for line in body():
            click.echo(line)
    except Exception as e:
        click.echo(f"error: {_error_text(e)}")
    click.echo("")


# --------------------------------------------------------------------------------------------
# show-config sections
# --------------------------------------------------------------------------------------------


def _version_lines() -> List[str]:
    from importlib.metadata import PackageNotFoundError, version

    lines = []
    for dist in DISTRIBUTIONS:
        try:
            lines.append(f"{dist}: {version(dist)}")
        except PackageNotFoundError:
            lines.append(f"{dist}: not installed")
    import flashinfer

    where = Path(__file__).resolve().parent
    ver = getattr(flashinfer, "__version__", "unknown")
    commit = getattr(flashinfer, "__git_commit__", None) or "unknown"
    lines.append(f"imported flashinfer: {ver} (commit {commit[:8]}) from {where}")
    return lines


def _torch_lines() -> List[str]:
    import torch

    lines = [f"torch: {torch.__version__}"]
    lines.append(f"torch CUDA: {torch.version.cuda or 'none (CPU build)'}")
    count = torch.cuda.device_count() if torch.version.cuda else 0
    if count == 0:
        return lines + ["GPUs: no CUDA device"]
    lines.append(f"GPUs: {count}")
    for i in range(count):
        major, minor = torch.cuda.get_device_capability(i)
        name = torch.cuda.get_device_name(i)
        lines.append(f"  cuda:{i}: {name} (compute capability {major}.{minor})")
    return lines


def _env_lines() -> List[str]:
    snapshot = knobs.env_snapshot()
    return [f"{name}={knobs.shown_value(name, value)}" for name, value in snapshot.items()]


def _jit_lines() -> List[str]:
    from .exceptions import NoSupportedArchError

    core = _jit_core()
    lines = []
    try:
        lines.append(f"target archs: {' '.join(core.resolve_archs())}")
    except NoSupportedArchError as e:
        lines.append(f"target archs: none ({e})")
    except Exception as e:
        lines.append(f"target archs: error ({_error_text(e)})")
    try:
        nvcc = core.find_nvcc()
        if nvcc is None:
            lines.append("nvcc: not found")
        else:
            lines.append(f"nvcc: {nvcc} (version {core.nvcc_version() or 'unknown'})")
    except Exception as e:
        lines.append(f"nvcc: error ({_error_text(e)})")
    lines.append(f"cache dir: {core.cache_dir()}")
    return lines


def _jit_cache_lines() -> List[str]:
    """The installed flashinfer-jit-cache's manifest: version, arch list, CUDA, modules."""
    from .jit import jit_cache

    return jit_cache.describe()


def _cubin_count(cubin_dir: Path) -> int:
    return sum(1 for _ in cubin_dir.rglob("*.cubin")) if cubin_dir.is_dir() else 0


def _module_counts(modules: List[dict]) -> str:
    counts = Counter(m["status"] for m in modules)
    parts = [f"{s}: {counts.get(s, 0)}" for s in ("aot", "compiled", "not-compiled")]
    return f"total: {len(modules)}, " + ", ".join(parts)


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def cli(ctx: click.Context) -> None:
    """FlashInfer CLI: inspect the installation, its caches and its compiled modules."""
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


@cli.command("show-config")
def show_config() -> None:
    """Print versions, devices, environment, JIT toolchain, artifacts and module status."""
    _section("Version Info", _version_lines)
    _section("Torch Version Info", _torch_lines)
    _section("Environment Variables", _env_lines)
    _section("JIT", _jit_lines)
    _section("JIT Cache Wheel", _jit_cache_lines)
    _section("Artifact Path", _artifacts_cli().artifact_path_lines)
    _section(
        "Downloaded Cubins",
        lambda: _artifacts_cli().downloaded_lines(_cubin_count(knobs.artifacts.cubin_dir)),
    )
    _section("Module Status", lambda: [_module_counts(_aot().module_status())])


@cli.command("clear-cache")
def clear_cache() -> None:
    """Remove the JIT build directories (downloaded cubins are kept)."""
    try:
        path = _jit_core().clear_jit_cache()
    except Exception as e:
        raise click.ClickException(f"could not clear the JIT cache: {_error_text(e)}") from e
    click.echo(f"Cache cleared successfully: {path}")


@cli.command("module-status")
@click.option("--detailed", is_flag=True, help="Also show each module's URI and path.")
@click.option(
    "--filter",
    "filter_",
    type=click.Choice(list(STATUS_FILTERS)),
    default="all",
    show_default=True,
    help="aot: from flashinfer-jit-cache; jit: built (or to be built) by the JIT; "
    "compiled: usable without compiling (aot or JIT-compiled); not-compiled: needs compiling.",
)
def module_status(detailed: bool, filter_: str) -> None:
    """List the known modules and whether they are compiled."""
    try:
        modules = _aot().module_status()
    except Exception as e:
        raise click.ClickException(f"could not list modules: {_error_text(e)}") from e
    keep = STATUS_FILTERS[filter_]
    shown = sorted((m for m in modules if m["status"] in keep), key=lambda m: m["name"])
    if not shown:
        click.echo(f"No modules match --filter {filter_}.")
    width = max((len(m["name"]) for m in shown), default=0)
    for m in shown:
        line = f"{m['name']:<{width}}  {m['status']}"
        if detailed:
            line += f"\n    uri: {m.get('uri') or '-'}\n    path: {m.get('path') or '-'}"
            if m.get("error"):
                line += f"\n    error: {m['error']}"
        click.echo(line)
    click.echo(f"\n{_module_counts(modules)}")


def _artifacts_cli():
    """flashinfer.artifacts.cli: the ``artifacts`` group and the show-config artifact sections."""
    from .artifacts import cli as artifacts_cli

    return artifacts_cli


# `flashinfer artifacts ...`, and FlashInfer's names for three of its commands.
cli.add_command(_artifacts_cli().artifacts_group)
cli.add_command(_artifacts_cli().download, "download-cubin")
cli.add_command(_artifacts_cli().list_cmd, "list-cubins")
cli.add_command(_artifacts_cli().clear, "clear-cubin")


def main(argv: Optional[List[str]] = None) -> None:
    cli.main(args=argv, prog_name="flashinfer")


if __name__ == "__main__":
    main()
