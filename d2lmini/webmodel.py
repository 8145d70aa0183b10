"""The model in the page: trained language models exported to run in the browser, with no kernel.

For the chapter "The 2026 block": :class:`ModelTwin` writes one self-contained HTML fragment
holding the 2017 and 2026 blocks' trained :class:`~d2lmini.lm.LanguageModel` (configuration and
float16 weights, base64, as inline JSON), the vocabulary and ``static_lm.js``, the same models
written in JavaScript (shipped with d2lmini). In the built HTML book, in Jupyter and in Colab the
reader types a prompt and the page generates text token by token, greedy or sampled, and shows
each head's attention weights and the stream's RMS after each block. Nothing is loaded from the
network. The page computes with the float16 weights: :func:`float16_rounded` gives the Python model
that computes with the same ones (:func:`import_model` reads them back from the page's data), whose
:func:`~d2lmini.lm.generate` the page reproduces greedily. :class:`ModelExplorer` is the live
explorer of Jupyter and Colab (ipywidgets, PyTorch generating), whose ``static()`` is the twin.

The twin sits inline in the chapter's page (about 0.57 MB of base64 per model of the chapter), not
in a file beside it: a page opened from the disk (``file://``) may not fetch a file, and Jupyter and
Colab show the same fragment as a cell output.
"""

from __future__ import annotations

import base64
import copy
import html
import json

import torch

from ._checks import check_instance, check_positive_int, check_seed
from .attention import MultiHeadAttention
from .ffn import FeedForward
from .lm import LanguageModel, generate

#: The most base64 text one model's weights may take in the page (about 750,000 float16 numbers).
MAX_MODEL_BYTES = 1_000_000

#: What ``static_lm.js`` computes: each option of a :class:`~d2lmini.lm.LanguageModel` it follows,
#: with the values it takes (the 2017 block's, the 2026 block's and every mix of them).
SUPPORTED = {"positions": ("learned", "sinusoidal", "rope"), "placement": ("post", "pre"), "norm": ("layer", "rms"),
             "act": ("relu", "swiglu"), "qk_norm": (None, "per_head")}

#: Attention options the page does not compute, with the value each must keep.
_ATTENTION_DEFAULTS = dict(window=None, rotary_dim=None, rope_scaling=None, sinks=None, scale=None, causal=True)


def _unsupported(model: LanguageModel) -> list[str]:
    """What of ``model`` the page cannot compute, as ``'option=value'`` strings (empty: all of it)."""
    block = model.blocks[0]
    found = {"positions": model.positions, "placement": block.placement, "norm": block.norm,
             "act": getattr(block.ffn, "act", None),
             "qk_norm": getattr(block.attention, "qk_norm", None)}
    problems = [f"{key}={value!r}" for key, value in found.items() if value not in SUPPORTED[key]]
    for i, b in enumerate(model.blocks):
        if type(b.attention) is not MultiHeadAttention or type(b.ffn) is not FeedForward:
            problems.append(f"block {i}'s {type(b.attention).__name__}/{type(b.ffn).__name__} "
                            "(MultiHeadAttention and FeedForward only)")
            continue
        problems += [f"block {i}'s {key}={getattr(b.attention, key)!r}" for key, value in _ATTENTION_DEFAULTS.items()
                     if getattr(b.attention, key) != value]
        if b.layer_scalar != 1.0 or not b.addnorm1.residual:
            problems.append(f"block {i}'s layer_scalar or residual=False")
        if any(a.residual_multiplier != 1.0 for a in (b.addnorm1, b.addnorm2)):
            problems.append(f"block {i}'s residual_multiplier")
    return problems


def _norm_eps(model: LanguageModel) -> float:
    """The epsilon of the blocks' norms (one for all of them and the final norm)."""
    addnorm = model.blocks[0].addnorm1
    return float((addnorm.norm_in if addnorm.norm_in is not None else addnorm.norm_post).eps)


def export_model(name: str, model: LanguageModel) -> dict:
    """One model as the page reads it: its configuration and its weights in float16.

    Args:
        name: what the page calls the model (e.g. ``'2026 block'``).
        model: a :class:`~d2lmini.lm.LanguageModel` of :data:`SUPPORTED` options (the chapter's
            ``LM_2017`` and ``lm_walk()[-1][1]``, any FFN width), on any device. Sinusoidal positions
            are not weights (``pos_encoding`` is a buffer outside the ``state_dict``): the page
            computes their table from ``config["positions"]``, as :func:`~d2lmini.lm.sinusoidal_positions` does.

    Returns:
        ``{"name", "config", "tensors", "weights"}``: ``config`` the sizes and options
        ``static_lm.js`` reads (``norm_eps`` and ``qk_norm_eps`` from the modules); ``tensors``
        ``[[state_dict name, shape], ...]`` in the order their numbers follow one another in
        ``weights``, the base64 text of little-endian float16 numbers (:func:`decode_weights` reads it);
        ``block_kwargs`` the model's (what :func:`import_model` builds it again with).

    Raises:
        TypeError: ``name`` not a str, ``model`` not a :class:`~d2lmini.lm.LanguageModel`.
        ValueError: an empty name; a model with an option the page does not compute (the message
            lists them), a weight beyond float16's range (65,504) or not finite, or weights over
            :data:`MAX_MODEL_BYTES` of base64 text.
    """
    check_instance("name", name, str, "a str")
    check_instance("model", model, LanguageModel, "a d2lmini.LanguageModel")
    if not name:
        raise ValueError("name must be a non-empty str")
    problems = _unsupported(model)
    if problems:
        raise ValueError(f"model {name!r}: the page cannot compute {', '.join(problems)}; it computes {SUPPORTED} "
                         "with the other options at their defaults")
    attention = model.blocks[0].attention
    config = dict(vocab_size=model.vocab_size, num_blocks=len(model.blocks), context_len=model.context_len,
                  num_hiddens=model.embedding.embedding_dim, num_heads=attention.num_heads,
                  num_kv_heads=attention.num_kv_heads, head_dim=attention.head_dim, positions=model.positions,
                  placement=model.blocks[0].placement, norm=model.blocks[0].norm, norm_eps=_norm_eps(model),
                  act=model.blocks[0].ffn.act, qk_norm=attention.qk_norm, qk_norm_eps=float(attention.qk_norm_eps),
                  rope_theta=attention.rope_theta)
    tensors, parts = [], []
    for key, value in model.state_dict().items():
        value = value.detach().float().cpu()
        if not torch.isfinite(value).all() or value.abs().max() > torch.finfo(torch.float16).max:
            raise ValueError(f"model {name!r}: {key} holds values float16 cannot keep (beyond 65504, or not finite)")
        tensors.append([key, list(value.shape)])
        parts.append(value.to(torch.float16).flatten())
    raw = torch.cat(parts).numpy().astype("<f2").tobytes()
    weights = base64.b64encode(raw).decode("ascii")
    if len(weights) > MAX_MODEL_BYTES:
        raise ValueError(f"model {name!r}: its weights take {len(weights):,} bytes of base64, over "
                         f"MAX_MODEL_BYTES={MAX_MODEL_BYTES:,}")
    return {"name": name, "config": config, "tensors": tensors, "weights": weights,
            "block_kwargs": dict(model.block_kwargs)}


def decode_weights(exported: dict) -> dict[str, torch.Tensor]:
    """The weights of :func:`export_model`'s output as float32 tensors, by ``state_dict`` name.

    Raises:
        TypeError: ``exported`` not a dict. ValueError: its ``weights`` and ``tensors`` disagree in size.
    """
    import numpy as np

    check_instance("exported", exported, dict, "a dict from export_model")
    values = torch.from_numpy(np.frombuffer(base64.b64decode(exported["weights"]), dtype="<f2").astype("float32"))
    sizes = [int(torch.tensor(shape).prod()) for _, shape in exported["tensors"]]
    if sum(sizes) != values.numel():
        raise ValueError(f"exported holds {values.numel()} numbers; its tensors need {sum(sizes)}")
    out, offset = {}, 0
    for (key, shape), size in zip(exported["tensors"], sizes):
        out[key] = values[offset:offset + size].reshape(shape).clone()
        offset += size
    return out


def import_model(exported: dict) -> LanguageModel:
    """The model of :func:`export_model`'s output, back in PyTorch: a :class:`~d2lmini.lm.LanguageModel`
    (float32, eval mode) built from its configuration, holding its float16 weights. It computes what
    the page computes, and equals :func:`float16_rounded` of the exported model.

    Raises:
        TypeError: ``exported`` not a dict. ValueError: its weights and tensors disagree in size or names.
    """
    check_instance("exported", exported, dict, "a dict from export_model")
    c = exported["config"]
    model = LanguageModel(c["vocab_size"], c["num_blocks"], c["context_len"], positions=c["positions"],
                          **exported["block_kwargs"])
    missing, unexpected = model.load_state_dict(decode_weights(exported), strict=False)
    if missing or unexpected:
        raise ValueError(f"exported does not fit its configuration: missing {missing}, unexpected {unexpected}")
    return model.eval()


def float16_rounded(model: LanguageModel) -> LanguageModel:
    """A copy of ``model`` (float32, eval mode) whose every weight is rounded to float16 and back:
    the weights the page computes with, so that :func:`~d2lmini.lm.generate` on it is what the page
    should write.

    Raises:
        TypeError: ``model`` not a :class:`~d2lmini.lm.LanguageModel`.
    """
    check_instance("model", model, LanguageModel, "a d2lmini.LanguageModel")
    rounded = copy.deepcopy(model).float().eval()
    with torch.no_grad():
        for parameter in rounded.parameters():
            parameter.copy_(parameter.to(torch.float16).float())
    return rounded


@torch.no_grad()
def inside(model: LanguageModel, ids: torch.Tensor) -> dict:
    """What the page's grid shows, computed by PyTorch: for the last ``context_len`` of ``ids``
    (1-D), every head's attention weights and the stream's RMS (over positions and features) after
    the embedding and after each block.

    Returns:
        ``{"attention": (num_blocks, num_heads, n, n) tensor (row p: how position p attends to
        0 .. p), "rms": [num_blocks + 1 floats]}``.

    Raises:
        TypeError: ``model`` not a :class:`~d2lmini.lm.LanguageModel`. ValueError: ``ids`` not a
        non-empty 1-D integer tensor of the vocabulary's ids, or a model :func:`export_model` rejects.
    """
    check_instance("model", model, LanguageModel, "a d2lmini.LanguageModel")
    problems = _unsupported(model)
    if problems:
        raise ValueError(f"inside computes what the page computes; not {', '.join(problems)}")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or not len(ids) or ids.is_floating_point():
        raise ValueError(f"ids must be a non-empty 1-D integer tensor, got {ids!r}")
    ids = ids[-model.context_len:][None].to(next(model.parameters()).device)
    streams, weights = [], []

    def attention_weights(module, args, output):
        q, k = module.queries_and_keys(args[0], args[1])
        k = k.repeat_interleave(module.num_heads // module.num_kv_heads, dim=1)
        logits = (q @ k.transpose(-1, -2) * module.logit_scale).float()
        n = logits.shape[-1]
        causal = torch.ones(n, n, dtype=torch.bool, device=logits.device).tril()
        weights.append(torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1)[0])

    hooks = [model.blocks[0].register_forward_pre_hook(lambda module, args: streams.append(args[0]))]
    hooks += [block.register_forward_hook(lambda module, args, output: streams.append(output)) for block in model.blocks]
    hooks += [block.attention.register_forward_hook(attention_weights) for block in model.blocks]
    was_training = model.training
    try:
        model.eval()
        model(ids)
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    return {"attention": torch.stack(weights).cpu(), "rms": [float(X.float().pow(2).mean().sqrt()) for X in streams]}


class ModelTwin:
    """Language models that run in the page: a prompt box, text token by token, the grid of attention.

    One self-contained HTML fragment (:meth:`to_html`): each model exported by :func:`export_model`
    and the vocabulary as inline JSON, and ``static_lm.js`` inline, which builds the controls (the
    prompt, which model or all side by side, temperature with 0 for greedy, top-k, seed, length)
    and generates as :func:`~d2lmini.lm.generate` does. Works in the built HTML book (opened as a
    file or served), and as a cell output in Jupyter and Colab; nothing comes from the network.
    Sampling uses the script's own seeded generator (mulberry32), so a seed repeats its sample in
    the page but is not torch's sample; greedy text equals ``generate`` on :func:`float16_rounded`
    models. A prompt that is empty or holds a character outside the vocabulary gets a message in
    the page.

    Args:
        models: ``{name: LanguageModel}``, one or more, each of the vocabulary's size (e.g. the
            chapter's ``{"2017 block": ..., "2026 block": ...}``).
        vocab: the characters, token id ``i`` being ``vocab[i]`` (a corpus's ``vocab``).
        prompt: the text the prompt box starts with (non-empty, characters of ``vocab``).
        max_new_tokens: the length the page's box starts with (``>= 1``; the reader may change it).
        seed: the seed the page's box starts with (an int >= 0).

    Example (the chapter "The 2026 block", after training; ``runs`` from ``train_capstone``)::

        best = best_runs(runs)
        ModelTwin({name: run.model for name, run in best.items()}, corpus.vocab,
                  prompt=SAMPLE_PROMPT, max_new_tokens=SAMPLE_LENGTH)

    Attributes:
        specs: the exported models (:func:`export_model`), in the order of ``models``.
        pytorch_greedy: ``{name: text}``, :func:`~d2lmini.lm.generate`'s greedy continuation of
            ``prompt`` by ``max_new_tokens`` on the float16 weights; the page says whether its own
            greedy text for that prompt is the same, character for character.
        vocab, prompt, max_new_tokens, seed: as given.

    Raises:
        TypeError: ``models`` not a dict of str to :class:`~d2lmini.lm.LanguageModel`, ``vocab`` not a
            list of str, ``prompt`` not a str, or ``max_new_tokens``/``seed`` not ints.
        ValueError: no models; a model the page cannot compute or too large (see :func:`export_model`);
            ``vocab`` entries that are not single distinct characters, or a model whose
            ``vocab_size`` differs from ``len(vocab)``; an empty prompt or one with characters
            outside ``vocab``; ``max_new_tokens < 1``; ``seed < 0``.
    """

    def __init__(self, models: dict, vocab: list, *, prompt: str = "The value of ", max_new_tokens: int = 200,
                 seed: int = 0):
        check_instance("models", models, dict, "a dict {name: LanguageModel}")
        if not models:
            raise ValueError("models must hold at least one {name: LanguageModel}")
        check_instance("vocab", vocab, list, "a list of single characters (a corpus's vocab)")
        if not all(isinstance(ch, str) for ch in vocab):
            raise TypeError("vocab must hold str characters only")
        if any(len(ch) != 1 for ch in vocab) or len(set(vocab)) != len(vocab) or not vocab:
            raise ValueError("vocab must be a non-empty list of distinct single characters")
        for name, model in models.items():
            check_instance("a key of models", name, str, "a str (the name the page shows)")
            check_instance(f"models[{name!r}]", model, LanguageModel, "a d2lmini.LanguageModel")
            if model.vocab_size != len(vocab):
                raise ValueError(f"models[{name!r}] has vocab_size={model.vocab_size}, but vocab holds {len(vocab)}")
        check_instance("prompt", prompt, str, "a str")
        unknown = sorted(set(prompt) - set(vocab))
        if not prompt or unknown:
            raise ValueError(f"prompt must be non-empty and hold characters of vocab only; got {prompt!r}"
                             + (f", whose {unknown} are not in vocab" if unknown else ""))
        self.max_new_tokens = check_positive_int("max_new_tokens", max_new_tokens)
        self.seed = check_seed(seed)
        if seed < 0:
            raise ValueError(f"seed must be >= 0 (the page's generator takes 32 bits), got {seed}")
        self.vocab, self.prompt = list(vocab), prompt
        self.specs = [export_model(name, model) for name, model in models.items()]
        ids = torch.tensor([self.vocab.index(ch) for ch in prompt])
        self.pytorch_greedy = {spec["name"]: "".join(self.vocab[i] for i in generate(
            import_model(spec), ids, self.max_new_tokens)[len(ids):].tolist()) for spec in self.specs}

    def to_html(self) -> str:
        """The twin as one self-contained HTML fragment (its data, the controls' container, the script)."""
        from importlib.resources import files

        script = files("d2lmini").joinpath("static_lm.js").read_text(encoding="utf-8")
        data = json.dumps(dict(models=self.specs, vocab=self.vocab, prompt=self.prompt,
                               max_new_tokens=self.max_new_tokens, seed=self.seed,
                               pytorch_greedy=self.pytorch_greedy),
                          separators=(",", ":")).replace("</", "<\\/")
        names = " and ".join(spec["name"] for spec in self.specs)
        return (f'<div class="d2l-lm-twin" role="group" aria-label="{html.escape(names)}: generate text in the page" '
                f'style="font-family: sans-serif; margin: 0.5em 0;">'
                f'<noscript>Allow scripts to run the models.</noscript>'
                f'<script type="application/json">{data}</script></div>\n<script>{script}</script>')

    def _repr_html_(self) -> str:
        return self.to_html()

    def __repr__(self) -> str:  # what a notebook shows where it cannot show HTML
        sizes = ", ".join(f"{spec['name']} ({len(spec['weights']):,} bytes)" for spec in self.specs)
        return f"<ModelTwin: {sizes}; {len(self.vocab)} characters>"


class ModelExplorer:
    """The live twin of :class:`ModelTwin` for Jupyter and Colab: the same controls, run by PyTorch.

    :meth:`static` is the kernel-free :class:`ModelTwin` (the built HTML book); displaying the
    explorer shows ipywidgets (7.7 as in Colab, or 8): the prompt, the model (or all side by side),
    temperature (0: greedy), top-k, seed and length, a Generate button; each model's text appears
    character by character, generated by :func:`~d2lmini.lm.generate` (torch's seeded sampling, so a
    seed repeats here but draws other characters than the page), then a figure of each head's
    attention and the stream's RMS after each block (:func:`inside`). The models compute with the
    page's float16 weights (:func:`import_model`), so greedy text is the page's.

    Args:
        models, vocab, prompt, max_new_tokens, seed: as for :class:`ModelTwin`.

    Raises:
        TypeError, ValueError: as :class:`ModelTwin`.
    """

    def __init__(self, models: dict, vocab: list, *, prompt: str = "The value of ", max_new_tokens: int = 200,
                 seed: int = 0):
        self.twin = ModelTwin(models, vocab, prompt=prompt, max_new_tokens=max_new_tokens, seed=seed)
        self.models = {spec["name"]: import_model(spec) for spec in self.twin.specs}
        self._widget = None

    def static(self) -> ModelTwin:
        """The kernel-free twin of this explorer (what the HTML book shows)."""
        return self.twin

    def message(self, prompt: str) -> str:
        """What the explorer says about ``prompt``: empty when it can be continued, else why not."""
        if not prompt:
            return "Type a prompt first: the model continues the text you write."
        unknown = [ch for ch in dict.fromkeys(prompt) if ch not in self.twin.vocab]
        if unknown:
            return (f"The model has never seen {', '.join(repr(ch) for ch in unknown)}: its vocabulary is the "
                    f"{len(self.twin.vocab)} characters of its training text. Remove or replace "
                    f"{'them' if len(unknown) > 1 else 'it'}.")
        return ""

    def run(self, prompt: str, name: str, *, temperature: float = 0.0, top_k: int | None = None, seed: int = 0,
            max_new_tokens: int | None = None) -> str:
        """The continuation the live explorer writes for these settings (``temperature=0``: greedy).

        Raises:
            ValueError: a prompt :meth:`message` objects to, or an unknown ``name``.
        """
        if self.message(prompt):
            raise ValueError(f"prompt: {self.message(prompt)}")
        if name not in self.models:
            raise ValueError(f"name must be one of {list(self.models)}, got {name!r}")
        ids = torch.tensor([self.twin.vocab.index(ch) for ch in prompt])
        n = self.twin.max_new_tokens if max_new_tokens is None else check_positive_int("max_new_tokens", max_new_tokens)
        sample = dict(do_sample=True, temperature=temperature, top_k=top_k, seed=seed) if temperature > 0 else {}
        return "".join(self.twin.vocab[i] for i in generate(self.models[name], ids, n, **sample)[len(ids):].tolist())

    def inside_figure(self, prompt: str, name: str) -> bytes:
        """PNG of one model's attention for ``prompt``: a row per block, a column per head, each the
        whole matrix (16 characters or fewer) or the last character's row; the RMS in the title."""
        from .plot import figure_png, new_figure

        model = self.models[name]
        ids = torch.tensor([self.twin.vocab.index(ch) for ch in prompt])
        seen = inside(model, ids)
        blocks, heads, n = seen["attention"].shape[:3]
        whole = n <= 16
        fig, axes = new_figure(heads, blocks, width=1.6 * heads + 0.6, height=(1.5 if whole else 0.7) * blocks + 0.6,
                               squeeze=False)
        for b in range(blocks):
            for h in range(heads):
                ax = axes[b][h]
                weights = seen["attention"][b, h] if whole else seen["attention"][b, h, -1:]
                ax.imshow(weights.numpy(), cmap="Blues", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
                ax.set_xticks([]), ax.set_yticks([])
                ax.set_title(f"block {b + 1}, head {h + 1}", fontsize=7)
        rms = ", ".join(f"{value:.2f}" for value in seen["rms"])
        fig.suptitle(f"{name}: stream RMS after the embedding and each block: {rms}", fontsize=8)
        return figure_png(fig)

    @property
    def widget(self):
        """The live explorer (an ``ipywidgets.VBox``), built on first use."""
        if self._widget is None:
            import ipywidgets as widgets

            names = list(self.models)
            prompt = widgets.Textarea(value=self.twin.prompt, description="prompt",
                                      layout=widgets.Layout(width="95%", height="4em"))
            choice = widgets.Dropdown(options=names + (["side by side"] if len(names) > 1 else []),
                                      value="side by side" if len(names) > 1 else names[0], description="model")
            temperature = widgets.FloatSlider(value=0.0, min=0.0, max=2.0, step=0.1, description="temperature")
            top_k = widgets.Dropdown(options=[("all", 0), ("1", 1), ("3", 3), ("5", 5), ("10", 10), ("20", 20)],
                                     value=0, description="top-k")
            seed = widgets.BoundedIntText(value=self.twin.seed, min=0, max=2**31 - 1, description="seed")
            length = widgets.BoundedIntText(value=self.twin.max_new_tokens, min=1, max=2000, description="length")
            button = widgets.Button(description="Generate")
            message = widgets.HTML(value="")
            outputs = widgets.HBox([])
            pictures = widgets.VBox([])

            def generate_now(_=None):
                text = prompt.value
                message.value = (f'<span style="color: #b03a2e;">{html.escape(self.message(text))}</span>'
                                 if self.message(text) else "")
                outputs.children, pictures.children = (), ()
                if self.message(text):
                    return
                chosen = names if choice.value == "side by side" else [choice.value]
                boxes = [widgets.Textarea(value=text, description=name, disabled=True,
                                          layout=widgets.Layout(width="48%" if len(chosen) > 1 else "95%",
                                                                height="14em")) for name in chosen]
                outputs.children = boxes
                pictures.children = [widgets.Image(value=self.inside_figure(text, name), format="png")
                                     for name in chosen]
                for name, box in zip(chosen, boxes):
                    new = self.run(text, name, temperature=temperature.value, top_k=top_k.value or None,
                                   seed=seed.value, max_new_tokens=length.value)
                    for end in range(1, len(new) + 1):  # the text appears character by character
                        box.value = text + new[:end]

            button.on_click(generate_now)
            self.inputs = dict(prompt=prompt, model=choice, temperature=temperature, top_k=top_k, seed=seed,
                               length=length, generate=button)
            self.message_widget, self.outputs, self.pictures = message, outputs, pictures
            self._widget = widgets.VBox([prompt, widgets.HBox([choice, temperature, top_k]),
                                         widgets.HBox([seed, length, button]), message, outputs, pictures])
        return self._widget

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)

    def __repr__(self) -> str:
        return f"<ModelExplorer: {', '.join(self.models)}; {len(self.twin.vocab)} characters>"


__all__ = ["MAX_MODEL_BYTES", "SUPPORTED", "ModelExplorer", "ModelTwin", "decode_weights", "export_model",
           "float16_rounded", "import_model", "inside"]
