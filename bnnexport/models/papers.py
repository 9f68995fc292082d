"""The paper that introduced each zoo model's architecture: what `bnnexport zoo list` shows as
`paper`, and what a result trained on it cites besides bnnexport's own references
(CITATION.cff).

Example:
    >>> from bnnexport.models.papers import paper_of
    >>> paper_of("xnornet").startswith("Rastegari, Ordonez")
    True
    >>> paper_of("mnist-bnn")  # bnnexport's own small model
    ''
"""

from __future__ import annotations

BNN = ("Hubara, Courbariaux, Soudry, El-Yaniv and Bengio, \"Binarized Neural Networks\", "
       "NeurIPS 2016 (arXiv:1602.02830)")  # fmt: skip
BACK_TO_SIMPLICITY = ("Bethge, Yang, Bornstein and Meinel, \"Back to Simplicity: How to Train "
                      "Accurate BNNs from Scratch?\", 2019 (arXiv:1906.08637)")  # fmt: skip
LCE = ("Bannink, Hillier, Geiger, de Bruin, Overweel, Neeven and Helwegen, \"Larq Compute "
       "Engine: Design, Benchmark and Deploy State-of-the-Art Binarized Neural Networks\", "
       "MLSys 2021 (arXiv:2011.09398)")  # fmt: skip

PAPERS = {
    "binarynet": BNN,
    "binary-alexnet": BNN,
    "xnornet": 'Rastegari, Ordonez, Redmon and Farhadi, "XNOR-Net: ImageNet Classification '
    'Using Binary Convolutional Neural Networks", ECCV 2016 (arXiv:1603.05279)',
    "birealnet18": 'Liu, Wu, Luo, Yang, Liu and Cheng, "Bi-Real Net: Enhancing the Performance '
    'of 1-bit CNNs With Improved Representational Capability and Advanced Training Algorithm", '
    "ECCV 2018 (arXiv:1808.00278)",
    "binary-densenet28": BACK_TO_SIMPLICITY,
    "binary-densenet37": BACK_TO_SIMPLICITY,
    "binary-densenet45": BACK_TO_SIMPLICITY,
    "binary-resnet-e18": BACK_TO_SIMPLICITY,
    "meliusnet22": 'Bethge, Bartz, Yang, Chen and Meinel, "MeliusNet: Can Binary Neural '
    'Networks Achieve MobileNet-level Accuracy?", 2020 (arXiv:2001.05936)',
    "dorefanet": 'Zhou, Wu, Ni, Zhou, Wen and Zou, "DoReFa-Net: Training Low Bitwidth '
    'Convolutional Neural Networks with Low Bitwidth Gradients", 2016 (arXiv:1606.06160)',
    "real-to-binary-net": 'Martinez, Yang, Bulat and Tzimiropoulos, "Training Binary Neural '
    'Networks with Real-to-Binary Convolutions", ICLR 2020 (arXiv:2003.11535)',
    "quicknet": LCE,
    "quicknet-small": LCE,
    "quicknet-large": LCE,
}


def paper_of(name: str) -> str:
    """The paper of model `name`'s architecture; '' for bnnexport's own and unknown models."""
    return PAPERS.get(name, "")
