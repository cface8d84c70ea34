"""The library's exceptions. Each carries one line a user can act on; the CLI prints it
as is and exits non-zero, so messages name the thing that is wrong and what to do."""


class MlxspecError(Exception):
    """Base class: anything the user can fix (input, models, machine)."""

    exit_code = 1
    # every rank of a distributed launch finds it alike (from the same command line and model
    # files), so rank 0 alone says it
    alike_on_every_rank = False


class InvalidOption(MlxspecError, ValueError):
    """A sampling or decoding option out of range, or one the rule cannot keep exact."""

    exit_code = 2
    alike_on_every_rank = True


class ModelNotFound(MlxspecError):
    """No such local folder, no such repo, or no network to fetch it."""


class ModelLoadError(MlxspecError):
    """The folder exists but is not a loadable mlx-lm model (missing or corrupt files)."""


class IncompatiblePair(MlxspecError):
    """Draft and target do not share a tokenizer: their token ids mean different things."""


class UnsupportedCache(MlxspecError):
    """A cache layer the engine cannot roll back exactly; refused rather than decoded wrong."""

    alike_on_every_rank = True


class UnsupportedShard(MlxspecError):
    """mlx-lm cannot split this architecture across ranks the way --shard asks."""

    alike_on_every_rank = True


class InsufficientMemory(MlxspecError):
    """The pair does not fit this machine's memory."""


class PromptTooLong(MlxspecError):
    """The prompt does not fit the target's context window."""


class PresetError(MlxspecError):
    """A models.toml preset that is unknown or a file that does not parse."""


class UnknownPreset(PresetError):
    """--pair names no preset: a bad option, refused before anything loads."""

    exit_code = 2
    alike_on_every_rank = True


class NotOnDisk(MlxspecError):
    """`mlxspec models rm NAME` names nothing mlxspec keeps on disk."""

    exit_code = 2


class UnsupportedModel(MlxspecError):
    """An architecture a drafter cannot serve (hidden-state capture, a head's family)."""

    alike_on_every_rank = True


class IncompatibleHead(MlxspecError):
    """A draft head whose shapes, layer ids or vocabulary do not fit its target."""


class ChatTemplateError(MlxspecError):
    """The model's chat template failed on the messages (or rendered them as nothing)."""


class DamagedHistory(MlxspecError):
    """A history file (drafting from earlier requests) that is truncated, altered or foreign:
    refused whole, and that history starts empty."""


class TrainingError(MlxspecError):
    """A training run that cannot go on: a folder that is not a run, a full disk, no data."""
