"""Model zoo: seeded architectures built in code (MobileNet-, ResNet-, EfficientNet-like, ...),
used by tests, benchmarks, examples and the README quickstart."""

from optcli.zoo.models import FULL_SIZE, ZOO, build, sample_inputs

__all__ = ["FULL_SIZE", "ZOO", "build", "sample_inputs"]
