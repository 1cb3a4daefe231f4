"""The user's line: the first Python frame outside torch and torch_tpu, which every error
about an op names (Debug's checks, DeferAndFuse's flush errors).

One rule says which code is internal: a code object whose file lies in torch's or
torch_tpu's package directory, is the standard library's contextlib (the `__exit__` of a
`with` over one of our generator-based context managers, such as capture's, is nobody's
line: the `with` is), or importlib's frozen bootstrap. It lives in C
(csrc/frames.cpp, `is_internal_code`), cached per code object, because DeferAndFuse asks
it for every recorded op (`user_line`); Debug's walk here asks the same function.
"""
from __future__ import annotations

import contextlib
import linecache
import os
import sys
import threading

import torch

from . import _C

DIRECTORIES = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
               os.path.dirname(os.path.abspath(__file__)) + os.sep,
               os.path.abspath(contextlib.__file__))
_C.frames_setup(DIRECTORIES)

is_internal = _C.is_internal_code  # (code object) -> bool
# () -> (file, line) of the innermost frame whose code is not internal, or ("<autograd>",
# 0). Only the location is kept: holding the frame would keep the caller's locals
# (activations) alive.
user_line = _C.user_line


def location(file: str, line: int, function: str | None = None) -> str:
    """How every message prints a place in the user's code."""
    return f"{file}:{line}" + (f" in {function}" if function else "")


def outside(frame):
    """-> (the first frame from `frame` outwards whose code is not internal, whether a
    backward call was passed on the way there)."""
    in_backward = False
    while frame is not None:
        if not is_internal(frame.f_code):
            return frame, in_backward
        in_backward = in_backward or frame.f_code.co_name == "_engine_run_backward"
        frame = frame.f_back
    return None, in_backward


def describe(frame) -> str:
    """The frame's location and its source line."""
    fn, line = frame.f_code.co_filename, frame.f_lineno
    text = linecache.getline(fn, line).strip()
    return location(fn, line, frame.f_code.co_name) + (f"\n    {text}" if text else "")


def user_location() -> str:
    """Where user code called the op running now. An op of a backward pass names the line
    that called backward(). Backward runs on the calling thread (_patches.py's
    _engine_run_backward); on an autograd worker thread, which has no user frame, that line
    is found on the waiting thread."""
    frame, in_backward = outside(sys._getframe(1))
    if frame is not None:
        return ("backward() called at " if in_backward else "") + describe(frame)
    me = threading.get_ident()
    for tid, top in sys._current_frames().items():
        if tid == me:
            continue
        f = top
        while f is not None and f.f_code.co_name != "_engine_run_backward":
            f = f.f_back
        if f is not None:
            frame, _ = outside(f)
            if frame is not None:
                return "backward() called at " + describe(frame)
    return "<no user frame: called from torch internals>"
