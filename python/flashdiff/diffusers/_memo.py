"""Work a step's signal and its forward share: within one adapter call, a module called
again with the same inputs gives back its first output instead of computing it again.

The budget's signal (FLUX: the patch embedding, the timestep/text embedding and the first
block's modulation of the image tokens) is computed before the step is decided; when the
step then runs whole, the transformer's forward computes the same three things from the
same inputs. ``_Memo`` wraps those modules for the length of one call: a call whose tensors
are the very objects of an earlier call (unchanged since: same ``_version``), or small
tensors (a timestep, a guidance scale) of equal values, returns that call's output."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from ._base import _torch

# Tensors this small are compared by value (a timestep or guidance scale, rebuilt by the
# forward as ``timestep * 1000``); larger ones only by identity.
_SMALL = 64


def _same(a: Any, b: Any) -> bool:
    torch = _torch()
    tensor = torch.Tensor
    if isinstance(a, tensor) or isinstance(b, tensor):
        if not (isinstance(a, tensor) and isinstance(b, tensor)):
            return False
        if a is b:
            return True  # unchanged since it was cached: the caller compares versions
        if a.numel() > _SMALL or a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            return False
        return bool(torch.equal(a, b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a is b or (type(a) is type(b) and a == b)


class _Memo:
    """Memoises `modules` (name -> module) while entered; ``hits`` counts the calls each
    answered from an earlier one."""

    def __init__(self, modules: Dict[str, Any]) -> None:
        self.modules = modules
        self.hits: Dict[str, int] = {}
        self._saved: List[Tuple[Any, Any]] = []

    def __enter__(self) -> "_Memo":
        torch = _torch()
        for name, m in self.modules.items():
            self.hits[name] = 0
            own = m.__dict__.get("forward")
            self._saved.append((m, own))
            orig = m.forward
            # (args, kwargs, grad mode, output, versions of args, kwargs and output then)
            seen: List[Tuple[Any, Any, bool, Any, Any]] = []

            def forward(*args: Any, _orig: Any = orig, _seen: Any = seen, _name: str = name, **kw: Any) -> Any:
                grad = torch.is_grad_enabled()
                for a, k, g, out, then in _seen:
                    if (g == grad and k.keys() == kw.keys() and _same(a, args)
                            and all(_same(k[key], kw[key]) for key in kw)
                            and _versions((a, k, out)) == then):
                        self.hits[_name] += 1
                        return out
                out = _orig(*args, **kw)
                _seen.append((args, kw, grad, out, _versions((args, kw, out))))
                return out

            object.__setattr__(m, "forward", forward)
        return self

    def __exit__(self, *exc: Any) -> None:
        for m, own in self._saved:
            if own is None:
                m.__dict__.pop("forward", None)
            else:
                object.__setattr__(m, "forward", own)
        self._saved.clear()

    def reused(self) -> bool:
        """Whether every memoised module (of at least one) answered a call from an earlier one."""
        return bool(self.hits) and all(n > 0 for n in self.hits.values())


def _versions(x: Any, tensor: Any = None) -> Any:
    """The in-place version of every tensor in `x` (nested tuples, lists, dicts): a cached
    call stands only while none of its inputs and outputs was changed in place."""
    tensor = tensor or _torch().Tensor
    if isinstance(x, tensor):
        return x._version
    if isinstance(x, (tuple, list)):
        return tuple([_versions(o, tensor) for o in x])
    if isinstance(x, dict):
        return tuple([(k, _versions(v, tensor)) for k, v in x.items()])
    return None
