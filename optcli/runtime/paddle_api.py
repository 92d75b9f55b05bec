"""A Paddle Lite style facade, for people moving from Paddle Lite's Python API:

    config = MobileConfig()
    config.set_model_from_file("model.nb")
    config.set_threads(2)
    predictor = create_paddle_predictor(config)
    predictor.get_input(0).from_numpy(x)
    predictor.run()
    y = predictor.get_output(0).numpy()
"""

from __future__ import annotations

import numpy as np

from optcli.errors import InputError, UsageError
from optcli.runtime.load import load


class MobileConfig:
    def __init__(self) -> None:
        self.model_file: str | None = None
        self.model_buffer: bytes | None = None
        self.threads: int | None = None

    def set_model_from_file(self, path: str) -> None:
        self.model_file = str(path)

    def set_model_from_buffer(self, data: bytes) -> None:
        self.model_buffer = bytes(data)

    def set_threads(self, threads: int) -> None:
        self.threads = int(threads)


class Tensor:
    """One input or output slot of a PaddlePredictor."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._array: np.ndarray | None = None

    def from_numpy(self, array: np.ndarray) -> None:
        self._array = np.asarray(array)

    def numpy(self) -> np.ndarray:
        if self._array is None:
            raise UsageError(f"tensor '{self.name}' holds no data yet; call run() first")
        return self._array

    def shape(self) -> list[int]:
        return list(self.numpy().shape)


class PaddlePredictor:
    def __init__(self, config: MobileConfig) -> None:
        source = config.model_buffer if config.model_buffer is not None else config.model_file
        if source is None:
            raise UsageError("MobileConfig has no model; call set_model_from_file(path) first")
        self._predictor = load(source, threads=config.threads)
        self._inputs = [Tensor(i.name) for i in self._predictor.inputs]
        self._outputs = [Tensor(o.name) for o in self._predictor.outputs]

    def get_input(self, index: int) -> Tensor:
        return _slot(self._inputs, index, "input")

    def get_output(self, index: int) -> Tensor:
        return _slot(self._outputs, index, "output")

    def get_input_names(self) -> list[str]:
        return [t.name for t in self._inputs]

    def get_output_names(self) -> list[str]:
        return [t.name for t in self._outputs]

    def run(self) -> None:
        empty = [t.name for t in self._inputs if t._array is None]
        if empty:
            raise InputError(f"inputs without data: {', '.join(empty)}; call get_input(i).from_numpy(x) first")
        results = self._predictor.run({t.name: t._array for t in self._inputs})
        for t in self._outputs:
            t._array = results[t.name]


def _slot(slots: list[Tensor], index: int, what: str) -> Tensor:
    if not 0 <= index < len(slots):
        raise UsageError(f"{what} index {index} is out of range; the model has {len(slots)} {what}s")
    return slots[index]


def create_paddle_predictor(config: MobileConfig) -> PaddlePredictor:
    return PaddlePredictor(config)
