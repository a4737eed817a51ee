"""The drafters that are not models: named where a model spec may stand (`--draft ngram`)."""

MODEL_FREE = ("ngram", "prompt-lookup", "suffix")


def is_model_free(spec: object) -> bool:
    return spec in MODEL_FREE
