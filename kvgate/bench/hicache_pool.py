"""A replica of SGLang 0.5.23's MHA host KV pool (``MHATokenToKVPoolHost``), CPU tensors only.

Why a replica: the real class lives in ``sglang.srt.mem_cache.pool_host``, whose package
import chain reaches ``torchvision``, and no torchvision build runs beside the CPU torch
2.13 this project pins. The methods a storage backend calls are copied from
``sglang/srt/mem_cache/pool_host/mha.py`` (``init_kv_buffer``, ``get_data_page``,
``get_dummy_flat_data_page``, ``set_from_flat_data_page``, ``get_page_buffer_meta``,
``get_size_per_token``) for the ``page_first`` and ``layer_first`` layouts, with the same
tensor shapes and pointer arithmetic, so the backend sees exactly the memory SGLang hands it.
The tests and ``kvgate bench sglang`` drive the backend with it; SGLang never loads it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from tiering.sglang.options import SGLangBackendOptions


class MHAHostPoolReplica:
    """K and V for ``size`` token slots of ``layer_num`` layers, laid out as SGLang does."""

    def __init__(
        self,
        *,
        size: int,
        page_size: int,
        layer_num: int,
        head_num: int,
        head_dim: int,
        dtype: torch.dtype = torch.bfloat16,
        layout: str = "page_first",
        storage_format_tag: str | None = None,
    ) -> None:
        assert size % page_size == 0
        self.size, self.page_size, self.layout = size, page_size, layout
        #: SGLang's ``HostKVCache.storage_format_tag``: None, or the name of a page format of
        #: the pool's own (``"unified-token-major"`` for the unified pool)
        self.storage_format_tag = storage_format_tag
        self.layer_num, self.head_num, self.head_dim = layer_num, head_num, head_dim
        self.dtype = dtype
        self.device = "cpu"
        self.pin_memory = False
        if layout == "page_first":
            dims = (2, size, layer_num, head_num, head_dim)
        elif layout == "layer_first":
            dims = (2, layer_num, size, head_num, head_dim)
        else:
            raise ValueError(f"the replica implements page_first and layer_first, not {layout}")
        self.kv_buffer = torch.zeros(dims, dtype=dtype)
        self._next_free = 0

    def alloc(self, need_size: int) -> torch.Tensor:
        """``need_size`` consecutive token slots (page aligned), as host indices."""
        assert need_size % self.page_size == 0 and self._next_free + need_size <= self.size
        start, self._next_free = self._next_free, self._next_free + need_size
        return torch.arange(start, start + need_size, dtype=torch.int64)

    def fill_random(self, indices: torch.Tensor, seed: int) -> None:
        """Random KV in the slots ``indices`` (stand-in for a GPU→host backup)."""
        gen = torch.Generator().manual_seed(seed)
        idx = indices.tolist()
        if self.layout == "page_first":
            shape = (2, len(idx), self.layer_num, self.head_num, self.head_dim)
            self.kv_buffer[:, idx] = torch.randn(shape, generator=gen).to(self.dtype)
        else:
            shape = (2, self.layer_num, len(idx), self.head_num, self.head_dim)
            self.kv_buffer[:, :, idx] = torch.randn(shape, generator=gen).to(self.dtype)

    def page_bytes(self, index: int) -> bytes:
        """The raw bytes of the page starting at slot ``index`` (flat data page order)."""
        return self.get_data_page(index, flat=True).contiguous().view(torch.uint8).numpy().tobytes()

    # --- copied from sglang/srt/mem_cache/pool_host/mha.py (MHATokenToKVPoolHost) ---------
    def get_size_per_token(self) -> int:
        return 2 * self.head_dim * self.head_num * self.layer_num * self.dtype.itemsize

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        if self.layout == "layer_first":
            data_page = self.kv_buffer[:, :, index : index + self.page_size, :, :]
        else:
            data_page = self.kv_buffer[:, index : index + self.page_size, :, :, :]
        if flat:
            data_page = data_page.flatten()
        return data_page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(
            (2, self.layer_num, self.page_size, self.head_num, self.head_dim), dtype=self.dtype
        ).flatten()

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        if self.layout == "layer_first":
            self.kv_buffer[:, :, index : index + self.page_size, :, :] = data_page.reshape(
                2, self.layer_num, self.page_size, self.head_num, self.head_dim
            )
        else:
            self.kv_buffer[:, index : index + self.page_size, :, :, :] = data_page.reshape(
                2, self.page_size, self.layer_num, self.head_num, self.head_dim
            )

    def get_page_buffer_meta(self, indices: torch.Tensor) -> tuple[list[int], list[int]]:
        assert len(indices) % self.page_size == 0
        ptr_list = []
        kv_buffer_data_ptr = self.kv_buffer.data_ptr()
        indices = indices.tolist()
        itemsize = self.dtype.itemsize
        v_offset = self.layer_num * self.size * self.head_num * self.head_dim * itemsize
        if self.layout == "layer_first":
            for index in range(0, len(indices), self.page_size):
                for layer_id in range(self.layer_num):
                    k_ptr = (
                        kv_buffer_data_ptr
                        + indices[index] * self.head_num * self.head_dim * itemsize
                        + layer_id * self.size * self.head_num * self.head_dim * itemsize
                    )
                    ptr_list.append(k_ptr)
                    ptr_list.append(k_ptr + v_offset)
            element_size = itemsize * self.page_size * self.head_num * self.head_dim
        else:
            for index in range(0, len(indices), self.page_size):
                k_ptr = (
                    kv_buffer_data_ptr
                    + indices[index] * self.layer_num * self.head_num * self.head_dim * itemsize
                )
                ptr_list.append(k_ptr)
                ptr_list.append(k_ptr + v_offset)
            element_size = (
                self.layer_num * itemsize * self.page_size * self.head_num * self.head_dim
            )
        return ptr_list, [element_size] * len(ptr_list)


def attach(
    options: SGLangBackendOptions,
    pool: MHAHostPoolReplica,
    *,
    tp_rank: int = 0,
    tp_size: int = 1,
    model_name: str = "",
    register: bool = True,
    **storage: Any,
) -> Any:
    """What SGLang's HiCacheController does on attach: the factory's dynamic path, then register.

    ``register=False`` stops before registering the host pool (SGLang's threads may call in
    that window). ``storage`` overrides fields of SGLang's ``HiCacheStorageConfig`` (an MLA
    model, decode context parallelism).

    Returns what SGLang would hold: our backend, or SGLang's failure injector around it
    when ``SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE`` is set.
    """
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    config = HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=True,
        is_page_first_layout=pool.layout == "page_first",
        model_name=storage_model_name(model_name, pool),
        # SGLang hands the parsed JSON of --hicache-storage-backend-extra-config.
        extra_config=options.to_extra_config(),
    )
    config = dataclasses.replace(config, **storage)
    backend = StorageBackendFactory.create_backend("dynamic", config, pool)
    if register:
        backend.register_mem_pool_host(pool)
    return backend


def storage_model_name(model_name: str | None, pool: MHAHostPoolReplica) -> str | None:
    """SGLang's name for storage keys, tagged with the pool's page format when it has one.

    Copied from ``sglang/srt/managers/cache_controller.py`` (whose import chain needs GPU
    kernels), which passes this to the backend as ``HiCacheStorageConfig.model_name``.
    """
    tag = pool.storage_format_tag
    if tag is None:
        return model_name
    return f"{model_name}-{tag}" if model_name else tag
