"""vLLM worker extension: in-place weight loading for the rollout server.

vLLM mixes this class into each of its workers (``LLM(worker_extension_cls=
"vllm_worker_ext.WeightLoadExtension")``); the server reaches its methods with
``llm.collective_rpc(name, args=...)``, which runs them in every worker (one
per tensor-parallel rank). Runs in the vLLM environment only.

Single machine path: the trainer writes the new weights to one safetensors file
in shared memory (/dev/shm); every worker opens it memory-mapped on its own
device and hands the tensors, under their Hugging Face names, to the model's
``load_weights``. That method maps HF names onto vLLM's fused parameters
(q/k/v -> qkv_proj, gate/up -> gate_up_proj) and each parameter's weight
loader copies its tensor-parallel shard, so the same file serves any TP size.
"""

from __future__ import annotations

import hashlib
from typing import Any


class WeightLoadExtension:
    """Methods added to every vLLM worker (``self`` is the worker)."""

    def _rlvr_model(self) -> Any:
        runner = self.model_runner
        return runner.get_model() if hasattr(runner, "get_model") else runner.model

    def rlvr_load_weights_from_file(self, path: str) -> int:
        """Load every tensor of the safetensors file ``path`` into the model in place.

        Returns the number of tensors read. Names are Hugging Face parameter
        names; tensors are cast to the parameter dtype by the weight loaders.

        Where the worker has ``reload_weights`` (vLLM >= 0.1x), that is used: it
        restores each layer's checkpoint-format parameters, loads, and runs the
        layer's post-load processing again. That matters on CPU, where linear
        weights are repacked for oneDNN after loading and the original
        parameters are freed, so a bare ``model.load_weights`` has nothing to
        load into. Older vLLM: ``model.load_weights`` (GPU weights stay in place).
        """
        from safetensors import safe_open

        model = self._rlvr_model()
        device = next(p.device for p in model.parameters() if p.numel())
        with safe_open(path, framework="pt", device=str(device)) as f:
            names = list(f.keys())
            weights = ((name, f.get_tensor(name)) for name in names)
            if hasattr(self, "reload_weights"):
                self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
            else:
                model.load_weights(weights=weights)
        self._rlvr_refresh_cpu_packed(model)
        return len(names)

    @staticmethod
    def _rlvr_refresh_cpu_packed(model: Any) -> int:
        """Rebuild CPU GEMM packings that the reload left stale; returns how many.

        On CPU, vLLM gives each linear-like module a ``cpu_linear`` over a packed
        copy of its weight. The reload re-processes the layers it loaded, but a
        tied LM head loads nothing itself (it shares the embedding's parameter):
        its parameter holds the new values while its packed copy keeps the old
        ones. Modules that kept a 2-D weight (embeddings, LM heads; linear layers
        free theirs after packing) are processed again from their current weight.
        On GPU no module has ``cpu_linear`` and nothing happens.
        """
        import torch

        refreshed = 0
        for module in model.modules():
            weight = getattr(module, "weight", None)
            method = getattr(module, "quant_method", None)
            if (hasattr(module, "cpu_linear") and method is not None and isinstance(weight, torch.Tensor)
                    and weight.ndim == 2 and weight.numel() > 0):
                method.process_weights_after_loading(module)
                refreshed += 1
        return refreshed

    def rlvr_weights_digest(self) -> str:
        """sha256 over the model's parameters (name, dtype, bytes): tells whether two loads agree."""
        import torch

        h = hashlib.sha256()
        for name, p in sorted(self._rlvr_model().named_parameters()):
            t = p.detach().to("cpu").contiguous()
            h.update(name.encode())
            h.update(str(t.dtype).encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return h.hexdigest()
