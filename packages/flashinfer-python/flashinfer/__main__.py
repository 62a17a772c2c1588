"""The ``flashinfer`` command line (also ``python -m flashinfer``).

Every command works on a machine without a GPU or nvcc: ``show-config`` prints each section on
its own, and a section that fails prints its error instead of stopping the others.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

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


def _torch_info() -> Dict[str, Any]:
    import torch

    count = torch.cuda.device_count() if torch.version.cuda else 0
    gpus = []
    for i in range(count):
        major, minor = torch.cuda.get_device_capability(i)
        gpus.append({"index": i, "name": torch.cuda.get_device_name(i),
                     "compute_capability": f"{major}.{minor}"})
    return {"version": torch.__version__, "cuda": torch.version.cuda, "gpus": gpus}


def _torch_lines() -> List[str]:
    info = _torch_info()
    lines = [f"torch: {info['version']}", f"torch CUDA: {info['cuda'] or 'none (CPU build)'}"]
    if not info["gpus"]:
        return lines + ["GPUs: no CUDA device"]
    lines.append(f"GPUs: {len(info['gpus'])}")
    lines += [f"  cuda:{g['index']}: {g['name']} (compute capability {g['compute_capability']})"
              for g in info["gpus"]]
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


def _module_rows() -> Tuple[List[dict], List[str]]:
    """Every registered module's status, and the reasons behind the not-compiled ones.

    With no GPU and no ``FLASHINFER_CUDA_ARCH_LIST`` no build can be named (its key includes the
    archs): the status is then given for the archs of the installed flashinfer-jit-cache, if a
    usable one is installed, and otherwise every module is not-compiled, for the reason said.
    """
    from .exceptions import NoSupportedArchError
    from .jit import jit_cache

    core = _jit_core()
    notes: List[str] = []
    no_arch: Optional[str] = None
    try:
        core.resolve_archs()
    except NoSupportedArchError as e:
        no_arch = str(e)
    except Exception:  # noqa: BLE001 - a bad arch list: each row carries the error
        pass
    wheel = jit_cache.installed() if no_arch else None
    if wheel is not None and wheel.usable and wheel.arch_list:
        archs = " ".join(wheel.arch_list)
        with knobs.jit.scope():
            knobs.jit.cuda_arch_list = archs
            rows = _aot().module_status()
        notes.append(
            "no CUDA GPU is visible and FLASHINFER_CUDA_ARCH_LIST is unset: status for the archs "
            f"of the installed flashinfer-jit-cache {wheel.version} ({archs}); set "
            "FLASHINFER_CUDA_ARCH_LIST for others"
        )
    else:
        rows = _aot().module_status()
        if no_arch:
            wheel_state = ("flashinfer-jit-cache is not installed" if wheel is None else
                           "the installed flashinfer-jit-cache is not used: " + wheel.problem)
            notes.append(
                f"why every module is not-compiled: {no_arch} (a module's build is named by its "
                f"target archs, so none can be looked up or compiled); {wheel_state}"
            )
    reasons = Counter(r["error"] for r in rows if r.get("error") and r["error"] != no_arch)
    notes += [f"{n} not-compiled because: {why}" for why, n in sorted(reasons.items())]
    pending = [r for r in rows if r["status"] == "not-compiled" and not r.get("error")]
    if pending:
        if knobs.jit.disable_jit:
            notes.append(f"{len(pending)} not-compiled and FLASHINFER_DISABLE_JIT=1: using them "
                         "raises MissingJITCacheError")
        elif core.find_nvcc() is None:
            notes.append(f"{len(pending)} not-compiled and nvcc is not found: install the CUDA "
                         "toolkit (or set FLASHINFER_NVCC / CUDA_HOME), or flashinfer-jit-cache")
        else:
            notes.append(f"{len(pending)} not-compiled: each is compiled on first use")
    return rows, notes


def _module_counts(modules: List[dict]) -> str:
    counts = Counter(m["status"] for m in modules)
    parts = [f"{s}: {counts.get(s, 0)}" for s in ("aot", "compiled", "not-compiled")]
    return f"total: {len(modules)}, " + ", ".join(parts)


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------


def _version_text() -> str:
    import flashinfer

    commit = getattr(flashinfer, "__git_commit__", None) or "unknown"
    return f"flashinfer {flashinfer.__version__} (commit {commit[:8]})"


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(_version_text())
        ctx.exit()


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_version, help="Print the version and commit, and exit.")
@click.option("--download-cubin", "download_cubin_flag", is_flag=True,
              help="Download the pinned release's kernel binaries first (as `flashinfer "
              "download-cubin`), then run the command, if one is given.")
@click.pass_context
def cli(ctx: click.Context, download_cubin_flag: bool) -> None:
    """FlashInfer CLI: inspect the installation, its caches and its compiled modules."""
    if download_cubin_flag:
        ctx.invoke(_artifacts_cli().download)
    elif ctx.invoked_subcommand is None:
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
    _section("Module Status", _module_status_lines)


def _module_status_lines() -> List[str]:
    rows, notes = _module_rows()
    return [_module_counts(rows), *notes]


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
        modules, notes = _module_rows()
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
    for note in notes:
        click.echo(note)


# --------------------------------------------------------------------------------------------
# collect-env, list-modules, export-compile-commands
# --------------------------------------------------------------------------------------------


def _dist_version(dist: str) -> Optional[str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _toolchain_info() -> Dict[str, Any]:
    from .jit import toolchain

    core = _jit_core()
    nvcc = core.find_nvcc()
    home = toolchain.cuda_home()
    info: Dict[str, Any] = {
        "nvcc": str(nvcc) if nvcc else None,
        "nvcc_version": core.nvcc_version() if nvcc else None,
        "cuda_home": str(home) if home else None,
        "host_compiler": toolchain.host_compiler(),
        "cache_dir": str(core.cache_dir()),
    }
    try:
        info["target_archs"] = core.resolve_archs()
    except Exception as e:  # noqa: BLE001 - reported, like show-config does
        info["target_archs"] = f"none ({_error_text(e)})"
    return info


def _env_report() -> Dict[str, Any]:
    """What a bug report needs; a part that fails holds its error instead."""
    import platform

    import flashinfer

    parts: Dict[str, Callable[[], Any]] = {
        "flashinfer": lambda: {
            "version": flashinfer.__version__,
            "commit": getattr(flashinfer, "__git_commit__", None),
            "path": str(Path(__file__).resolve().parent),
        },
        "packages": lambda: {d: _dist_version(d) for d in (
            *DISTRIBUTIONS, "torch", "click", "ninja", "requests", "boto3")},
        "system": lambda: {"python": platform.python_version(), "executable": sys.executable,
                           "platform": platform.platform()},
        "torch": _torch_info,
        "toolchain": _toolchain_info,
        "jit_cache": _jit_cache_lines,
        "artifacts": lambda: _artifacts_cli().artifact_path_lines(),
        "environment": lambda: {k: knobs.shown_value(k, v)
                                for k, v in knobs.env_snapshot().items() if v is not None},
    }
    report: Dict[str, Any] = {}
    for name, part in parts.items():
        try:
            report[name] = part()
        except Exception as e:  # noqa: BLE001 - one broken part must not hide the others
            report[name] = {"error": _error_text(e)}
    return report


def _text(value: Any, indent: str = "  ") -> List[str]:
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                out += [f"{indent}{k}:", *_text(v, indent + "  ")]
            else:
                out.append(f"{indent}{k}: {'-' if v is None or v == [] or v == {} else v}")
        return out
    if isinstance(value, list):
        return [line for v in value for line in (
            _text(v, indent + "  ") if isinstance(v, dict) else [f"{indent}{v}"])]
    return [f"{indent}{value}"]


@cli.command("collect-env")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of text.")
def collect_env(as_json: bool) -> None:
    """Print the environment for a bug report: versions, GPUs, toolchain, variables."""
    report = _env_report()
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=False))
        return
    for name, value in report.items():
        click.echo(f"{name}:")
        for line in _text(value):
            click.echo(line)


def _registered_specs() -> list:
    """Every registered module: the one place the CLI asks for the list."""
    from . import aot

    return aot.registered_specs()


@cli.command("list-modules")
@click.argument("name", required=False)
def list_modules(name: Optional[str]) -> None:
    """List the registered modules, or show one module's sources, flags and status."""
    import difflib

    specs = {s.name: s for s in _registered_specs()}
    if name is None:
        width = max(map(len, specs), default=0)
        for n in sorted(specs):
            click.echo(f"{n:<{width}}  {len(specs[n].sources)} sources")
        click.echo(f"\n{len(specs)} modules; `flashinfer list-modules NAME` shows one, "
                   "`flashinfer module-status` what is compiled")
        return
    spec = specs.get(name)
    if spec is None:
        close = difflib.get_close_matches(name, list(specs), n=5)
        raise click.ClickException(
            f"no module named {name!r}; "
            + (f"did you mean: {', '.join(close)}?" if close else
               f"`flashinfer list-modules` lists the {len(specs)} modules")
        )
    majors = spec.supported_major_versions
    lines = [
        f"name: {spec.name}",
        "sources:", *[f"  {p}" for p in spec.source_paths()],
        f"supported compute capability majors: {' '.join(map(str, majors)) if majors else 'any'}",
        f"extra nvcc flags: {shlex.join(spec.extra_cuda_cflags) or '-'}",
        f"extra host compiler flags: {shlex.join(spec.extra_cflags) or '-'}",
        f"extra linker flags: {shlex.join(spec.extra_ldflags) or '-'}",
        f"extra include dirs: {' '.join(spec.extra_include_dirs) or '-'}",
    ]
    for line in lines:
        click.echo(line)
    rows, notes = _module_rows()
    row = next((r for r in rows if r["name"] == name), None)
    if row is not None:
        click.echo(f"status: {row['status']}\nuri: {row.get('uri') or '-'}\n"
                   f"path: {row.get('path') or '-'}")
        for note in [row["error"]] if row.get("error") else notes:
            click.echo(f"note: {note}")


#: export-compile-commands' arch when no GPU is visible and no arch list is set (only the
#: -gencode flags depend on it; an editor's language server needs some arch).
DEFAULT_COMMANDS_ARCH = "9.0a"


@cli.command("export-compile-commands")
@click.argument("path", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write it (the same as PATH; default: ./compile_commands.json).")
def export_compile_commands(path: Optional[Path], output: Optional[Path]) -> None:
    """Write compile_commands.json (every source of every registered module, with the flags
    the JIT uses) for clangd and other language servers."""
    from .exceptions import NoSupportedArchError
    from .jit import archs as _archs
    from .jit import toolchain
    from .jit.ninja import object_name

    if path is not None and output is not None and path != output:
        raise click.UsageError(f"give the output once: PATH ({path}) or --output ({output})")
    out = output or path or Path("compile_commands.json")
    core = _jit_core()
    try:
        requested = _archs.requested_archs()
        note = ""
    except NoSupportedArchError:
        requested = _archs.parse_arch_list(DEFAULT_COMMANDS_ARCH)
        note = (f" (no GPU visible and FLASHINFER_CUDA_ARCH_LIST unset: flags for "
                f"{DEFAULT_COMMANDS_ARCH}; set FLASHINFER_CUDA_ARCH_LIST for others)")
    entries, skipped = [], []
    for spec in _registered_specs():
        try:
            archs = _archs.select_archs(requested, spec.supported_major_versions, spec.name)
            plan = core.plan_build(spec, archs)
        except Exception as e:  # noqa: BLE001 - listed, the others are still written
            skipped.append(f"{spec.name}: {_error_text(e)}")
            continue
        nvcc, cxx = str(plan.nvcc or "nvcc"), toolchain.host_compiler()
        for i, src in enumerate(plan.sources):
            obj = str(plan.build_dir / object_name(src, i))
            args = ([nvcc, *plan.cuda_cflags] if src.suffix == ".cu" else [cxx, *plan.cflags])
            entries.append({"directory": str(plan.build_dir), "file": str(src),
                            "arguments": [*args, "-c", str(src), "-o", obj], "output": obj})
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries, indent=2) + "\n")
        os.replace(tmp, out)
    except OSError as e:
        raise click.ClickException(f"could not write {out}: {_error_text(e)}") from None
    modules = len({e["directory"] for e in entries})
    click.echo(f"wrote {len(entries)} compile commands ({modules} modules, archs "
               f"{' '.join(map(str, requested))}) to {out}{note}")
    for line in skipped:
        click.echo(f"skipped {line}", err=True)


# --------------------------------------------------------------------------------------------
# install-cubin-wheel, install-jit-cache-wheel (download-jit-cache), download-kernels
# --------------------------------------------------------------------------------------------


def _cuda_major(cuda_version: Optional[str]) -> int:
    """The CUDA major of ``--cuda-version`` (13.0, 13, cu130), else of torch.version.cuda."""
    if cuda_version is not None:
        text = cuda_version.strip().lower().removeprefix("cu")
        head = text.split(".")[0]
        if head.isdigit() and (("." in text) or len(head) <= 2):
            return int(head)
        if text.isdigit() and len(text) == 3:  # cu130, cu128: major and minor digits
            return int(text[:2])
        raise click.BadParameter(
            f"expected a CUDA version such as 13.0, 13 or cu130, received {cuda_version!r}",
            param_hint="--cuda-version",
        )
    try:
        import torch

        runtime = torch.version.cuda
        where = f"torch {torch.__version__}"
    except ImportError:
        runtime, where = None, "torch is not installed"
    if not runtime:
        raise click.ClickException(
            f"no CUDA runtime to match ({where}, no CUDA build): the wheels are per CUDA major; "
            "give it with --cuda-version (e.g. 13.0), or install a CUDA build of torch"
        )
    return int(runtime.split(".")[0])


def _release_version(flashinfer_version: Optional[str]) -> str:
    import flashinfer

    from . import _versions

    text = flashinfer_version or flashinfer.__version__
    try:
        version = _versions.public_version(text)
    except ValueError:
        version = ""
    if not version or version.startswith("0.0.0"):
        hint = "--flashinfer-version" if flashinfer_version else "this build's version"
        raise click.BadParameter(
            f"expected a release version X.Y.Z, received {text!r} ({hint}; a source checkout "
            "has no release version): pass --flashinfer-version X.Y.Z",
            param_hint="--flashinfer-version",
        )
    return version


def _pip_command(dists: Tuple[str, ...], flashinfer_version: Optional[str],
                 cuda_version: Optional[str], index_url: Optional[str]) -> List[str]:
    version = _release_version(flashinfer_version)
    template = index_url or knobs.artifacts.wheel_index_url
    if "{major}" in template:
        url = template.replace("{major}", str(_cuda_major(cuda_version)))
    elif cuda_version is not None:
        raise click.UsageError(
            f"--cuda-version {cuda_version} has no effect: the index {template} has no {{major}} "
            "placeholder (give an index of that CUDA instead)"
        )
    else:
        url = template
    return [sys.executable, "-m", "pip", "install", "--index-url", url,
            *(f"{d}=={version}" for d in dists)]


def _install(dists: Tuple[str, ...], flashinfer_version: Optional[str],
             cuda_version: Optional[str], index_url: Optional[str], nightly: bool,
             dry_run: bool) -> None:
    if nightly:
        raise click.UsageError(
            "--nightly: this project publishes no nightly wheels; give the index that holds "
            "the ones you want with --index-url (or FLASHINFER_WHEEL_INDEX_URL)"
        )
    cmd = _pip_command(dists, flashinfer_version, cuda_version, index_url)
    if dry_run:
        click.echo(shlex.join(cmd))
        return
    click.echo(f"running: {shlex.join(cmd)}", err=True)
    code = subprocess.run(cmd, check=False).returncode
    if code:  # exit with pip's status: callers (vLLM's download-kernels) pass it on
        error = click.ClickException(f"pip exited with status {code} (its output is above)")
        error.exit_code = code
        raise error


def _install_command(name: str, dists: Tuple[str, ...], what: str) -> click.Command:
    @click.option("--flashinfer-version", default=None,
                  help="Version to install (default: this flashinfer's, exactly).")
    @click.option("--cuda-version", "--cuda", "cuda_version", default=None,
                  help="CUDA of the index, e.g. 13.0 or cu130 (default: torch.version.cuda).")
    @click.option("--index-url", default=None,
                  help="Wheel index; {major} becomes the CUDA major (default: "
                  "FLASHINFER_WHEEL_INDEX_URL, https://flashinfer.ai/whl/cu{major}0/).")
    @click.option("--nightly", is_flag=True, help="Refused: no nightly wheels are published.")
    @click.option("--dry-run", is_flag=True, help="Print the pip command instead of running it.")
    def command(**options: Any) -> None:
        _install(dists, **options)

    command.__doc__ = (f"pip-install {what} of exactly this flashinfer's version, from the wheel "
                       "index of the runtime's CUDA major.")
    return cli.command(name)(command)


install_cubin_wheel = _install_command(
    "install-cubin-wheel", ("flashinfer-cubin",), "flashinfer-cubin (the kernel binaries)")
install_jit_cache_wheel = _install_command(
    "install-jit-cache-wheel", ("flashinfer-jit-cache",),
    "flashinfer-jit-cache (the precompiled modules)")
download_kernels = _install_command(
    "download-kernels", ("flashinfer-cubin", "flashinfer-jit-cache"),
    "flashinfer-cubin and flashinfer-jit-cache")
# FlashInfer's older name, kept working and out of --help.
cli.add_command(click.Command("download-jit-cache", params=install_jit_cache_wheel.params,
                              callback=install_jit_cache_wheel.callback, hidden=True,
                              help=install_jit_cache_wheel.help))


def _artifacts_cli():
    """flashinfer.artifacts.cli: the ``artifacts`` group and the show-config artifact sections."""
    from .artifacts import cli as artifacts_cli

    return artifacts_cli


# `flashinfer artifacts ...`, and FlashInfer's names for three of its commands.
cli.add_command(_artifacts_cli().artifacts_group)
cli.add_command(_artifacts_cli().download, "download-cubin")
cli.add_command(_artifacts_cli().list_cmd, "list-cubins")
cli.add_command(_artifacts_cli().clear, "clear-cubin")


# --- `flashinfer replay`: re-run level-10 dumps (flashinfer/api_dump.py) ---
@cli.command("replay")
@click.option("--dir", "dump_dir", required=True,
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A FLASHINFER_DUMP_DIR written at FLASHINFER_LOGLEVEL=10.")
@click.option("--device", default=None, help="Run on this device (default: where dumped).")
@click.option("--rtol", type=float, default=1e-2, show_default=True)
@click.option("--atol", type=float, default=1e-2, show_default=True)
def replay(dump_dir: Path, device: Optional[str], rtol: float, atol: float) -> None:
    """Re-run each dumped call and report whether its outputs match the dumped ones."""
    from .api_dump import replay_dir, summary

    results = replay_dir(dump_dir, device=device, rtol=rtol, atol=atol)
    for r in results:
        click.echo(f"{r.status.upper():<9} {Path(r.folder).name}  {r.api}  {r.detail}")
    match, mismatch, error, skipped = summary(results)
    click.echo(f"{len(results)} calls: {match} match, {mismatch} mismatch, {error} error, "
               f"{skipped} skipped")
    if mismatch or error or not results:
        raise SystemExit(1)


def main(argv: Optional[List[str]] = None) -> None:
    cli.main(args=argv, prog_name="flashinfer")


if __name__ == "__main__":
    main()
