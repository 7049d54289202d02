"""Per-token side data of a trajectory: named arrays aligned with its token ids.

Some facts about a trajectory are per token and are not token ids, masks or the sampling logprobs:
the experts a mixture-of-experts model routed each position to (:data:`ROUTED_EXPERTS`, for
routing replay), a teacher's logprob of each sampled token (:data:`TEACHER_LOGPROBS`, for
on-policy distillation). Each such fact is one :class:`TokenChannel` in
:attr:`agentrl.Trajectory.channels`: a fixed-shape row per token (``uint8 [layers, top_k]`` for
routing, a ``float32`` scalar for a logprob) and a presence flag per token, so a row can be
missing (a position the engine never prefilled, a token nobody scored) without a sentinel value.

Contract:

- a channel has exactly one row per token of its trajectory (``len(channel) == len(tokens)``),
  appended with the tokens it belongs to and checked by the trajectory's invariants;
- rows may arrive after their tokens (an engine returns the routing of the previous turn's last
  token with the next turn): :meth:`TokenChannel.write` sets rows at any position already held;
- :attr:`TokenChannel.alignment` says what a row describes: ``token`` (the token itself, e.g. a
  logprob of it: in a next-token micro-batch it sits with the position that predicts the token)
  or ``position`` (the forward pass at the token's position, with the token as input: routing);
- on disk a channel is packed: the present rows' bytes (little-endian, base64) and the present
  spans, so routing costs ``layers × top_k`` bytes per token (one byte per expert index up to
  256 experts).

Example::

    traj.append_model(ids, logprobs, channels={ROUTED_EXPERTS: experts_tlk})  # rows for the new tokens
    traj.write_channel(ROUTED_EXPERTS, start, rows)                            # rows that arrive later
    traj.channels[ROUTED_EXPERTS].values, traj.channels[ROUTED_EXPERTS].present
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from agentrl._enum import NamedEnum

__all__ = [
    "DTYPES",
    "ROUTED_EXPERTS",
    "ROUTING_DIFFERS",
    "TEACHER_LOGPROBS",
    "Alignment",
    "ChannelError",
    "TokenChannel",
]

ROUTED_EXPERTS = "routed_experts"  # [layers, top_k] expert ids per position (mixture-of-experts routing)
ROUTING_DIFFERS = "routing_differs"  # per position, the MoE layers whose trainer routing differs from the engine's
TEACHER_LOGPROBS = "teacher_logprobs"  # a teacher's logprob of each sampled token (on-policy distillation)

# the element types a channel may hold (stored little-endian on disk)
DTYPES = ("uint8", "uint16", "int16", "int32", "int64", "float16", "float32", "float64")


class ChannelError(ValueError):
    """A channel row, write or record that breaks the channel's contract (shape, type, length)."""


class Alignment(NamedEnum):
    """What a channel's row at position ``t`` describes (see the module doc)."""

    TOKEN = "token"  # token t itself (a logprob of it)
    POSITION = "position"  # the forward pass at position t, token t as input (routing)


# the alignment of the channels agentrl itself writes; any other name defaults to ``token``
_KNOWN_ALIGNMENT = {ROUTED_EXPERTS: Alignment.POSITION, ROUTING_DIFFERS: Alignment.POSITION,
                    TEACHER_LOGPROBS: Alignment.TOKEN}


def default_alignment(name: str) -> Alignment:
    return _KNOWN_ALIGNMENT.get(name, Alignment.TOKEN)


class TokenChannel:
    """One named per-token array: ``values`` ``[len, *row_shape]`` of ``dtype`` and ``present`` ``[len]``.

    Grows in place (amortised doubling), so appending turn after turn stays linear. Picklable and
    copyable; two channels are equal when dtype, row shape, alignment, presence and the present
    rows are equal (absent rows are ignored). Not thread-safe.
    """

    __slots__ = ("_n", "_present", "_values", "alignment", "dtype", "row_shape")

    def __init__(self, dtype: str | np.dtype[Any], row_shape: Sequence[int] = (), *, length: int = 0,
                 alignment: Alignment | str = Alignment.TOKEN) -> None:
        name = np.dtype(dtype).name
        if name not in DTYPES:
            raise ChannelError(f"dtype={name!r}; expected one of {', '.join(DTYPES)}")
        shape = tuple(int(d) for d in row_shape)
        if any(d <= 0 for d in shape):
            raise ChannelError(f"row_shape={shape}; expected positive dimensions")
        self.dtype = name
        self.row_shape = shape
        self.alignment = Alignment(alignment)
        self._values = np.zeros((max(length, 8), *shape), dtype=name)
        self._present = np.zeros(max(length, 8), dtype=bool)
        self._n = int(length)

    # -- views -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    @property
    def values(self) -> npt.NDArray[Any]:
        """``[len, *row_shape]`` (a view; absent rows hold zeros)."""
        return self._values[: self._n]

    @property
    def present(self) -> npt.NDArray[np.bool_]:
        """``[len]`` booleans: which rows are set (a view)."""
        return self._present[: self._n]

    @property
    def num_present(self) -> int:
        return int(self.present.sum())

    @property
    def complete(self) -> bool:
        """Every row is present."""
        return bool(self.present.all())

    @property
    def bytes_per_row(self) -> int:
        return int(np.dtype(self.dtype).itemsize * math.prod(self.row_shape))

    def spans(self) -> list[tuple[int, int]]:
        """The present rows as ``[start, end)`` runs, in order."""
        flags = np.concatenate(([False], self.present, [False])).astype(np.int8)
        edges = np.flatnonzero(np.diff(flags))
        return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]

    def rows(self, start: int, end: int) -> tuple[npt.NDArray[Any], npt.NDArray[np.bool_]]:
        """Copies of ``values[start:end]`` and ``present[start:end]``."""
        return self.values[start:end].copy(), self.present[start:end].copy()

    # -- growth and writes -----------------------------------------------------------------
    def _reserve(self, n: int) -> None:
        if n <= len(self._present):
            return
        cap = max(n, 2 * len(self._present))
        values = np.zeros((cap, *self.row_shape), dtype=self.dtype)
        present = np.zeros(cap, dtype=bool)
        values[: self._n] = self._values[: self._n]
        present[: self._n] = self._present[: self._n]
        self._values, self._present = values, present

    def _as_rows(self, rows: Any, what: str) -> npt.NDArray[Any]:
        arr = np.asarray(rows)
        if arr.shape[1:] != self.row_shape:
            raise ChannelError(f"{what}: rows of shape {tuple(arr.shape[1:])}; expected {self.row_shape} per token "
                               f"(the channel's row shape)")
        if arr.dtype.kind == "f" and np.dtype(self.dtype).kind != "f":
            raise ChannelError(f"{what}: floating-point rows for an integer channel ({self.dtype})")
        if np.dtype(self.dtype).kind == "f":
            if arr.size and not np.isfinite(arr).all():
                raise ChannelError(f"{what}: a row holds a NaN or an infinity; expected finite values")
        elif arr.size:
            info = np.iinfo(self.dtype)
            lo, hi = int(arr.min()), int(arr.max())
            if lo < info.min or hi > info.max:
                raise ChannelError(f"{what}: values in [{lo}, {hi}] do not fit {self.dtype} [{info.min}, {info.max}]")
        return arr.astype(self.dtype, copy=False)

    def check_rows(self, rows: Any, n: int) -> npt.NDArray[Any]:
        """``rows`` as this channel's dtype, checked to be ``n`` rows of its row shape; raises ChannelError."""
        arr = self._as_rows(rows, "rows")
        if len(arr) != n:
            raise ChannelError(f"{len(arr)} rows for {n} new tokens; expected one row per token")
        return arr

    def extend(self, n: int, rows: Any = None) -> None:
        """Adds ``n`` positions: absent, or set to ``rows`` (``[n, *row_shape]``)."""
        if n < 0:
            raise ChannelError(f"extend: n={n}; expected >= 0")
        arr = None if rows is None else self.check_rows(rows, n)
        self._reserve(self._n + n)
        if arr is not None:
            self._values[self._n: self._n + n] = arr
            self._present[self._n: self._n + n] = True
        else:
            self._present[self._n: self._n + n] = False
        self._n += n

    def write(self, start: int, rows: Any) -> int:
        """Sets the rows at ``[start, start + len(rows))`` (positions already held). Returns how many of
        them were present before with a different value (the caller decides whether that matters)."""
        arr = self._as_rows(rows, "write")
        end = start + len(arr)
        if start < 0 or end > self._n:
            raise ChannelError(f"write: rows for positions [{start}, {end}); expected positions within [0, {self._n})")
        old = self._values[start:end]
        was = self._present[start:end]
        differs = was & (old != arr).reshape(len(arr), -1).any(axis=1) if arr.size else was & False
        self._values[start:end] = arr
        self._present[start:end] = True
        return int(differs.sum())

    def copy(self) -> TokenChannel:
        return self.slice(0, self._n)

    def slice(self, start: int, end: int) -> TokenChannel:
        """A new channel holding rows ``[start, end)``."""
        other = TokenChannel(self.dtype, self.row_shape, alignment=self.alignment, length=0)
        other.extend(end - start)
        other._values[: end - start] = self._values[start:end]
        other._present[: end - start] = self._present[start:end]
        return other

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TokenChannel):
            return NotImplemented
        return (self.dtype, self.row_shape, self.alignment, self._n) == \
            (other.dtype, other.row_shape, other.alignment, other._n) and \
            bool(np.array_equal(self.present, other.present)) and \
            bool(np.array_equal(self.values[self.present], other.values[other.present]))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"TokenChannel({self.dtype}, row_shape={self.row_shape}, len={self._n}, present={self.num_present}, "
                f"alignment={self.alignment.value})")

    def __getstate__(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "row_shape": self.row_shape, "alignment": self.alignment.value,
                "values": self.values.copy(), "present": self.present.copy()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.dtype, self.row_shape = state["dtype"], tuple(state["row_shape"])
        self.alignment = Alignment(state["alignment"])
        self._values, self._present, self._n = state["values"], state["present"], len(state["present"])
        if self._n == 0:
            self._values = np.zeros((8, *self.row_shape), dtype=self.dtype)
            self._present = np.zeros(8, dtype=bool)

    # -- serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Packed: the present rows' little-endian bytes (base64) and the present spans."""
        present = self.values[self.present]
        data = np.ascontiguousarray(present.astype(np.dtype(self.dtype).newbyteorder("<"), copy=False)).tobytes()
        return {"dtype": self.dtype, "row_shape": list(self.row_shape), "alignment": self.alignment.value,
                "length": self._n, "spans": [list(s) for s in self.spans()],
                "data": base64.b64encode(data).decode("ascii")}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TokenChannel:
        try:
            channel = cls(str(data["dtype"]), tuple(data["row_shape"]), alignment=data.get("alignment", "token"))
            length = int(data["length"])
            spans = [(int(a), int(b)) for a, b in data["spans"]]
            raw = base64.b64decode(str(data["data"]), validate=True)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ChannelError):
                raise
            raise ChannelError(f"channel record: expected dtype/row_shape/length/spans/data, got "
                               f"{dict(data)!r:.200} ({type(exc).__name__}: {exc})") from exc
        channel.extend(length)
        n_rows = sum(b - a for a, b in spans)
        if len(raw) != n_rows * channel.bytes_per_row:
            raise ChannelError(f"channel record: {len(raw)} data bytes for {n_rows} present rows of "
                               f"{channel.bytes_per_row} bytes; expected {n_rows * channel.bytes_per_row}")
        rows = np.frombuffer(raw, dtype=np.dtype(channel.dtype).newbyteorder("<")).reshape(n_rows, *channel.row_shape)
        at, last = 0, 0
        for a, b in spans:
            if a < last or b <= a or b > length:
                raise ChannelError(f"channel record: span [{a}, {b}); expected ordered, non-empty spans within "
                                   f"[0, {length})")
            channel.write(a, rows[at: at + b - a])
            at, last = at + b - a, b
        return channel
