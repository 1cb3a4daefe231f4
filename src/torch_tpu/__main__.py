"""`python -m torch_tpu COMMAND`: the runtime's own commands (info, settings), and the
commands other installed packages add.

`COMMANDS` is the runtime's table: name -> (help, add_arguments, main). Other packages
add commands through the entry-point group `torch_tpu.commands` (name -> a module with
`HELP`, `add_arguments(parser)` and `main(args) -> int`): the tools package of this
distribution adds demo, bench, validate and report there (pyproject.toml). So the runtime
never imports its tools, and a command of a package that is not installed is simply absent.
"""
from __future__ import annotations

import argparse
import sys

# ---------------------------------------------------------------- info
def info_lines() -> list[tuple[str, str]]:
    """The versions, then the binding this environment gets (_binding.py: decided without
    starting anything, so a launch can be checked first), then the device it started."""
    import jax
    import jaxlib
    import torch

    import torch_tpu
    from torch_tpu import _binding, _runtime
    from torch_tpu import lowering

    lines = [
        ("torch_tpu", getattr(torch_tpu, "__version__", _dist_version("torch_tpu"))),
        ("torch", torch.__version__),
        ("jax", jax.__version__),
        ("jaxlib", jaxlib.__version__),
    ]
    try:
        lines += _binding.current().describe()
        d = _runtime.device()
    except _binding.BindingError as e:
        return lines + [("device", f"did not start: {e}")]
    props = torch.tpu.get_device_properties()
    fallback = torch_tpu._dispatch._cpu_fallback[0]
    return lines + [
        ("PJRT platform", d.platform),
        ("device kind", d.device_kind),
        ("this process's device", f"{d} (id {d.id}{_coords(props)})"),
        ("local devices", ", ".join(str(x) for x in jax.local_devices(backend=d.platform))),
        ("torch device", f"{torch.device('tpu', torch.tpu.current_device())} "
                         f"(device_count={torch.tpu.device_count()})"),
        ("eager mode", torch_tpu.get_eager_mode().value),
        ("CPU fallback", "on" if fallback else "off"),
        ("lowerings", str(len(lowering.LOWERINGS))),
    ]


def _coords(props) -> str:
    return f", chip coordinates {tuple(props.coords)}" if props.coords is not None else ""


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


# ---------------------------------------------------------------- settings
def _add_settings_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--write", metavar="FILE", nargs="?", const="docs/SETTINGS.md",
                   help="rewrite the settings table between its marker lines in FILE "
                        "(default docs/SETTINGS.md, from the current directory)")


def _settings_main(args) -> int:
    import pathlib

    from torch_tpu import _config

    if args.write:
        path = pathlib.Path(args.write)
        path.write_text(_config.with_table(path.read_text()))
        print(f"wrote the settings table into {path}")
        return 0
    print(_config.markdown_table(), end="")
    for name in _config.SETTINGS:
        if _config.is_set(name):
            print(f"set here: {name} -> {_config.get(name)!r}")
    for name in _config.undeclared():
        print(f"set here but not a torch_tpu setting (a typo?): {name}")
    return 0


# ---------------------------------------------------------------- the table
COMMANDS = {
    "info": ("versions, PJRT platform, devices, eager mode, lowerings",
             lambda p: None, _info_main),
    "settings": ("every TORCH_TPU_* setting: type, default, when it is read (--write FILE)",
                 _add_settings_arguments, _settings_main),
}
ENTRY_POINT_GROUP = "torch_tpu.commands"


def commands() -> dict:
    """The runtime's commands, then those of the installed packages, by name."""
    import importlib.metadata

    found = dict(COMMANDS)
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if ep.name in found:
            continue  # the runtime's own name wins; an installed package cannot shadow it
        module = ep.load()
        found[ep.name] = (module.HELP, module.add_arguments, module.main)
    return found


# ---------------------------------------------------------------- entry
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m torch_tpu",
        description="torch_tpu: an XLA device as the native PyTorch device 'tpu'.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_, add_arguments, run) in commands().items():
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.set_defaults(_run=run)
        add_arguments(sp)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
