"""The PyTorch side of a BNN: binary layers, quantizers, and the one discovery of binary kernels.

- `layers.py`: `BinaryConv2d` and `BinaryLinear`, whose weight IS the ±1 kernel;
- `quantizers.py`: activation and kernel quantizers registered by name (larq's semantics);
- `precision.py`: bf16 arithmetic that is exact on ±1 operands;
- `discover.py`: which parameters of any `nn.Module` are binary kernels, decided once from one
  forward pass, and the record (`BinaryKernels`) every stage reads;
- `int8.py`: quantization-aware training of the float layers (PyTorch's fake quantization on
  every float conv and dense layer) and the model `export` writes from it;
- `sign_trace.py`: the activation binarizations of any `nn.Module` (`torch.sign`, comparisons
  with zero, STEs of its own, the detach trick), found in one traced forward pass and imposed
  in another.

In: an `nn.Module` (bnnexport's or yours). Out: its binary kernels, layers that compute them.
It may import torch, numpy; never the rest of bnnexport.
"""
