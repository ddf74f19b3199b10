"""A safetensors file written tensor by tensor, so a conversion never holds the whole model.

The header (names, dtypes, shapes, byte offsets) is written first from the known target shapes; each
tensor is then written at its offset as soon as it is assembled, in any order. ``close`` checks that
every declared tensor arrived. The result is an ordinary safetensors file (``safe_open`` /
``load_file`` read it).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

_DTYPE_NAMES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_ALIGN = 8  # header padded to 8 bytes, as the reference writer does


class StreamingSafetensorsWriter:
    """``specs``: ``{name: (dtype, shape)}`` of every tensor the file will hold; ``write`` each once."""

    def __init__(
        self,
        path: str | Path,
        specs: dict[str, tuple[torch.dtype, tuple[int, ...]]],
        metadata: dict[str, str] | None = None,
    ) -> None:
        self.path = Path(path)
        self.specs = dict(specs)
        header: dict[str, object] = {}
        if metadata:
            header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
        offset = 0
        self._offsets: dict[str, int] = {}
        for name, (dtype, shape) in self.specs.items():
            if dtype not in _DTYPE_NAMES:
                raise ValueError(f"{name}: dtype {dtype} cannot be stored in safetensors")
            nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            header[name] = {
                "dtype": _DTYPE_NAMES[dtype],
                "shape": list(shape),
                "data_offsets": [offset, offset + nbytes],
            }
            self._offsets[name] = offset
            offset += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % _ALIGN)
        self._data_start = 8 + len(raw)
        self._f = open(self.path, "wb")  # noqa: SIM115 (closed by close())
        self._f.write(len(raw).to_bytes(8, "little"))
        self._f.write(raw)
        self._f.truncate(self._data_start + offset)
        self._written: set[str] = set()

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Write ``name`` (cast to its declared dtype; the shape must match)."""
        if name not in self.specs:
            raise KeyError(f"{name} is not a tensor of {self.path.name}")
        if name in self._written:
            raise ValueError(f"{name} was already written to {self.path.name}")
        dtype, shape = self.specs[name]
        if tuple(tensor.shape) != tuple(shape):
            raise ValueError(f"{name}: expected shape {list(shape)}, got {list(tensor.shape)}")
        t = tensor.detach().to(device="cpu", dtype=dtype).contiguous()
        self._f.seek(self._data_start + self._offsets[name])
        if t.numel():
            self._f.write(t.view(-1).view(torch.uint8).numpy())
        self._written.add(name)

    @property
    def missing(self) -> list[str]:
        return sorted(set(self.specs) - self._written)

    def close(self) -> None:
        """Close the file; raises if a declared tensor was never written (the file is then removed)."""
        self._f.close()
        if self.missing:
            self.path.unlink(missing_ok=True)
            m = self.missing
            raise ValueError(f"{self.path}: {len(m)} tensor(s) never written, e.g. {m[:5]}")

    def abort(self) -> None:
        """Close and remove the unfinished file (after an error elsewhere; raises nothing itself)."""
        self._f.close()
        self.path.unlink(missing_ok=True)
