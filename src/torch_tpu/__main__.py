"""`python -m torch_tpu COMMAND`: info, demo, bench NAME, validate, settings, report.

`COMMANDS` at the bottom is the dispatch table: name -> (help, add_arguments, main). A
command in its own module is one line, `"name": ("help", *_module("torch_tpu.x"))`, where
the module provides `add_arguments(parser)` and `main(args) -> int`. Benchmarks have their
own table, `torch_tpu.bench.BENCHES`, so `bench NAME` grows by one line there.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# ---------------------------------------------------------------- info
def info_lines() -> list[tuple[str, str]]:
    import jax
    import jaxlib
    import torch

    import torch_tpu
    from torch_tpu import _runtime
    from torch_tpu import lowering

    d = _runtime.device()
    mode = torch_tpu.get_eager_mode().value
    fallback = torch_tpu._dispatch._cpu_fallback[0]
    return [
        ("torch_tpu", getattr(torch_tpu, "__version__", _dist_version("torch_tpu"))),
        ("torch", torch.__version__),
        ("jax", jax.__version__),
        ("jaxlib", jaxlib.__version__),
        ("PJRT platform", d.platform),
        ("device kind", d.device_kind),
        ("devices", ", ".join(str(x) for x in jax.local_devices(backend=d.platform))),
        ("torch device", f"{torch.device('tpu', 0)} (device_count={torch.tpu.device_count()})"),
        ("eager mode", mode),
        ("CPU fallback", "on" if fallback else "off"),
        ("lowerings", str(len(lowering.LOWERINGS))),
    ]


def _dist_version(name: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _info_main(args) -> int:
    lines = info_lines()
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        print(f"{k + ':':{width + 1}} {v}")
    return 0


# ---------------------------------------------------------------- bench
def _add_bench_arguments(p: argparse.ArgumentParser) -> None:
    from torch_tpu.bench import BENCHES

    sub = p.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name, (module, help_) in BENCHES.items():
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.set_defaults(_bench_module=module)
        importlib.import_module(module).add_arguments(sp)


def _bench_main(args) -> int:
    return importlib.import_module(args._bench_module).main(args)


# ---------------------------------------------------------------- settings
def _add_settings_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--write", action="store_true",
                   help="rewrite the settings table in the repository's README.md")


def _settings_main(args) -> int:
    import pathlib

    from torch_tpu import _config

    if args.write:
        readme = pathlib.Path(__file__).resolve().parents[2] / "README.md"
        readme.write_text(_config.readme_with_table(readme.read_text()))
        print(f"wrote the settings table into {readme}")
        return 0
    print(_config.markdown_table(), end="")
    for name in _config.SETTINGS:
        if _config.is_set(name):
            print(f"set here: {name} -> {_config.get(name)!r}")
    for name in _config.undeclared():
        print(f"set here but not a torch_tpu setting (a typo?): {name}")
    return 0


# ---------------------------------------------------------------- the table
def _module(path: str):
    """(add_arguments, main) of a command that lives in module `path`."""
    return (lambda p: importlib.import_module(path).add_arguments(p),
            lambda args: importlib.import_module(path).main(args))


COMMANDS = {
    "info": ("versions, PJRT platform, devices, eager mode, lowerings",
             lambda p: None, _info_main),
    "demo": ("train a small Llama on CPU and on tpu (Strict, DeferAndFuse, compiled), check parity",
             *_module("torch_tpu.demo")),
    "bench": ("benchmarks: bench NAME (see `bench --help`)",
              _add_bench_arguments, _bench_main),
    "validate": ("sweeps on tpu vs CPU: validate ops|models|report (docs/VALIDATION.md)",
                 *_module("torch_tpu.validation.cli")),
    "settings": ("every TORCH_TPU_* setting: type, default, when it is read (--write: README)",
                 _add_settings_arguments, _settings_main),
    "report": ("the program caches of the last runs: memory and disk hits, compile times",
               *_module("torch_tpu._report")),
}


# ---------------------------------------------------------------- entry
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m torch_tpu",
        description="torch_tpu: an XLA device as the native PyTorch device 'tpu'.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_, add_arguments, run) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.set_defaults(_run=run)
        add_arguments(sp)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
