"""The conformance corpus's models with dropout (their configs' defaults: 0.1), in training mode, where the corpus
builds them in eval: ``train_mode:<name>`` with this folder on ``PYTHONPATH`` (``bash docs/ranks/zb/others.sh
train_mode:gpt2 train_mode:bert train_mode:t5 train_mode:bart``). Each check holds their dropout at its likeliest
(every unit kept: :mod:`envs.real.fixed_draws`); before, every check of them said UNCHECKED.
"""

from graphs.models.corpus import build


def _train(name: str):
    def built():
        model, inputs = build(name)
        return model.train(), inputs

    built.__doc__ = f"The corpus's {name}, in training mode (dropout on)."
    return built


gpt2, bert, t5, bart, opt = (_train(n) for n in ("gpt2", "bert", "t5", "bart", "opt"))
