"""Training backends: how gradients are reduced, optimizers stepped and state saved (plain PyTorch or DeepSpeed)."""
