"""Where each recipe departs from the code that published its number, with that code's line:
what `bnnexport recipes` lists under a recipe's `assumptions`.

The paper's recipes come from plumerai/rethinking-bnn-optimization at commit 2823525 (docs/
LCE_NOTES.md "Paper recipes": its `bnn_optimization/` files, read line by line); larq-zoo's from
its training tasks and model files (docs/LCE_NOTES.md "larq-zoo's models"). What a recipe
matches is not listed: the CIFAR-10 BinaryNet recipes train BatchNorm after the max-pool with
Keras' ε and momentum (`binarynet(pool_first=True, bn_eps=1e-3, bn_momentum=0.01)`), the
ImageNet ones normalise pixels with the authors' mean and std, and every recipe evaluates with
BatchNorm's moving averages (`bn_eval="moving"`), as Keras' `fit` does.

Example:
    >>> from bnnexport.training.deviations import cifar_binarynet
    >>> any("pad" in line and "binarynet.py:28" in line for line in cifar_binarynet("bop"))
    True
"""

from __future__ import annotations

# the authors' files at the commit every paper recipe cites
AUTHORS = "plumerai/rethinking-bnn-optimization@2823525 bnn_optimization/"
MODELS = f"{AUTHORS}models/"

# Bop's update in the authors' code: sign(-sign(w·m - τ)·w) with larq's sign(0) = +1, so a weight
# with w·m exactly τ becomes +1 (a -1 flips); bnnexport flips only where w·m > τ (Algorithm 2)
TIE_RULE = (
    "a weight whose w·m equals τ exactly keeps its sign, as the paper's Algorithm 2 says; the "
    f"authors' update sign(-sign(w·m - τ)·w) with sign(0) = +1 ({AUTHORS}optimizers.py:107, "
    "larq's Bop alike) makes it +1 (a -1 flips); with τ > 0 a tie needs w·m = τ to the bit"
)


def adam_eps(where: str) -> str:
    """Adam's ε, torch's default against Keras' (the authors' Adam is at `where`)."""
    return f"Adam's ε: torch's 1e-8 (the authors' tf.keras.optimizers.Adam: Keras' 1e-7, {where})"


CIFAR_PAD = (
    "augmentation pads the [-1, 1] image with 0, mid-grey (the authors pad the uint8 image with "
    f"0, black, before scaling it to [-1, 1]: {AUTHORS}data/cifar10.py:11, :15)"
)
# larq's QuantConv2D pads with 0 unless told otherwise (pad_values=0.0): "same" is zero padding
ONE_PADDING = (
    "binary 'same' convs pad the binarized input with +1, every value ±1 so LCE keeps it "
    "bit-packed (the authors: Keras padding='same', zeros{where}); model_kwargs "
    "{{'pad_value': 'zero'}} trains theirs"
)
IMAGENET_LAST_BATCH = (
    "an epoch ends with the short batch of the images left over (1,281,167 = 1251 x 1024 + "
    f"143); the authors' epoch drops it (steps_per_epoch = images // batch: {AUTHORS}"
    "train.py:48)"
)
IMAGENET_CROPS = (
    "training crops: torchvision's random-resized rule (scale 0.08-1, ratio 3/4-4/3, 10 tries, "
    "bilinear) and a horizontal flip; evaluation: resize to 256, center 224 (the authors: the "
    f"same ranges, bicubic, and a 224/256 center crop: {AUTHORS}data/imagenet.py "
    "`_decode_and_random_crop`, `_decode_and_center_crop`)"
)


def first_step(where: str, init: str = "Glorot-uniform") -> str:
    """The start of Bop's kernels: ±1 here, real in the authors' first forward pass."""
    return (
        f"binary kernels start as random ±1 (the authors': {init} real kernels, used as they "
        f"are in the first forward pass (kernel_quantizer=None, {where}) until Bop's first "
        f"update binarizes them, {AUTHORS}optimizers.py:107)"
    )


def cifar_binarynet(hyperparameters: str) -> tuple[str, ...]:
    """The CIFAR-10 BinaryNet recipes' deviations; `hyperparameters`: the authors' class
    ("bop", "bop_sec52" or "default", the latent-weight one)."""
    padding = ONE_PADDING.format(where=f", {MODELS}binarynet.py:28, :33, :37, :42, :46")
    adam = {"default": 69, "bop": 85, "bop_sec52": 105}[hyperparameters]
    common = (padding, CIFAR_PAD, adam_eps(f"{MODELS}binarynet.py:{adam}"))
    if hyperparameters == "default":  # Adam on latent weights: no Bop, no ±1 start
        return common
    line = {"bop": 77, "bop_sec52": 95}[hyperparameters]
    return (*common, first_step(f"{MODELS}binarynet.py:{line}"), TIE_RULE)


def imagenet_common(padding_lines: str, adam_line: str) -> tuple[str, ...]:
    """What every paper ImageNet recipe does differently, with the model file's lines of its
    padding and its Adam."""
    padding = ONE_PADDING.format(where=f", {padding_lines}")
    return (padding, IMAGENET_CROPS, IMAGENET_LAST_BATCH, adam_eps(adam_line), TIE_RULE)


BINARY_ALEXNET = (
    "BatchNorm before each max-pool, without a trainable scale, ε 1e-5 (the authors: max-pool, "
    "then BatchNorm(scale=True, momentum=0.9) with Keras' ε 1e-3: "
    f"{MODELS}binary_alexnet.py:29-31, :38); with a scale that may turn negative the two "
    "orders differ even in eval mode",
    first_step(f"{MODELS}binary_alexnet.py:24"),
    *imagenet_common(f"{MODELS}binary_alexnet.py:22", f"{MODELS}binary_alexnet.py:86"),
)
XNORNET = (
    "BatchNorm before the max-pools after binary convs, without a trainable scale, ε 1e-5 "
    "everywhere (the authors: max-pool, then BatchNorm(scale=True, momentum=0.9), ε 1e-5 after "
    f"the first conv, 1e-4 after the binary convs, 1e-3 after the last: {MODELS}xnor.py:28, "
    ":31-43, :49)",
    first_step(f"{MODELS}xnor.py:11"),
    *imagenet_common(f"{MODELS}xnor.py:32-39", f"{MODELS}xnor.py:89"),
)
BIREALNET = (
    "BatchNorm ε 1e-5 (the authors: Keras' 1e-3, momentum 0.8 as here: "
    f"{MODELS}birealnet.py:22, :35, :49)",
    "the stem's 3x3/2 max-pool pads 1 on every side (the authors' padding='same' pads only "
    f"the bottom and right of the 112x112 map: {MODELS}birealnet.py:50)",
    first_step(f"{MODELS}birealnet.py:30-31", init="Glorot-normal"),
    *imagenet_common(f"{MODELS}birealnet.py:28", f"{MODELS}birealnet.py:95"),
)


def larq_zoo(model_file: str) -> str:
    """A larq-zoo recipe's layout line: where bnnexport's model says it differs."""
    return (
        f"the model as bnnexport/models/{model_file} builds it, which says where it differs "
        "from larq-zoo's (docs/LCE_NOTES.md \"larq-zoo's models\"); evaluation with BatchNorm's "
        "moving averages, as larq-zoo's Keras training evaluates"
    )
