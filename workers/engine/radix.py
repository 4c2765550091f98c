"""Radix prefix cache over KV pages, one tree per namespace (a tenant's cache salt).

Each edge is one full page of ``page_size`` token ids and each node owns the pool page that
holds those tokens' KV, so a path from a namespace root spells a cached prefix. Pages
in use by a running request are pinned by reference counts along their path; only
unreferenced leaves are evicted, least recently used first. Each page goes to the lower
tiers (an ``offer`` hook, tiering) once, with its full token chain and its KV: when the
tree takes it under write-through, else when it is evicted; pages that came from the
tiers are not sent back. Two namespaces never share a node, so one tenant's prompt can
neither hit nor time another's.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from workers.engine.kv_pool import KVPool
from workers.engine.offload import OffloadPage

log = logging.getLogger(__name__)


class _Node:
    __slots__ = (
        "children", "key", "last_access", "namespace", "page", "parent", "ref", "stored"
    )  # fmt: skip

    def __init__(
        self,
        namespace: str,
        parent: _Node | None,
        key: tuple[int, ...],
        page: int | None,
        stored: bool = False,
    ) -> None:
        self.namespace = namespace
        self.parent = parent
        self.key = key
        self.page = page
        self.children: dict[tuple[int, ...], _Node] = {}
        self.ref = 0
        self.last_access = 0
        #: the lower tiers have (or were handed) this page's KV
        self.stored = stored

    def path(self) -> Iterator[_Node]:
        """This node and its ancestors up to (not including) the namespace root."""
        node: _Node | None = self
        while node is not None and node.page is not None:
            yield node
            node = node.parent


#: Opaque handle to a cached prefix; pass it back to :meth:`RadixCache.lock`/``unlock``.
PrefixHandle = _Node


@dataclass(frozen=True)
class PrefixMatch:
    """The longest cached prefix: its pages in order and a handle for pinning them."""

    node: PrefixHandle
    pages: list[int]


class RadixCache:
    """Page-granular prefix tree owning the pool pages it caches."""

    def __init__(
        self,
        pool: KVPool,
        offer: Callable[[list[OffloadPage]], None] | None = None,
        *,
        write_through: bool = False,
    ) -> None:
        """``offer`` takes pages for the lower tiers: every page the tree takes with
        ``write_through``, else every page it evicts (never one twice)."""
        self.pool = pool
        self.page_size = pool.page_size
        self.offer = offer
        self.write_through = write_through
        self._roots: dict[str, _Node] = {}
        # page nodes without children: eviction candidates (when unpinned), kept up to date
        # so that eviction looks at one node per cached sequence, not at every page
        self._leaves: set[_Node] = set()
        self._clock = itertools.count(1)
        self._pages = 0
        self._pinned = 0  # nodes with ref > 0
        self.evicted_pages = 0

    # --- size ---------------------------------------------------------------------------------
    @property
    def cached_pages(self) -> int:
        """Pages held by the tree, pinned or not."""
        return self._pages

    @property
    def evictable_pages(self) -> int:
        """Pages that :meth:`evict` could free now."""
        return self._pages - self._pinned

    # --- lookup and insert ----------------------------------------------------------------------
    def _root(self, namespace: str) -> _Node:
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = _Node(namespace, None, (), None)
        return root

    def _keys(self, token_ids: Sequence[int], n_pages: int) -> Iterator[tuple[int, ...]]:
        ps = self.page_size
        for i in range(n_pages):
            yield tuple(token_ids[i * ps : (i + 1) * ps])

    def match(
        self, namespace: str, token_ids: Sequence[int], max_pages: int | None = None
    ) -> PrefixMatch:
        """Longest cached run of full pages at the start of ``token_ids`` (at most ``max_pages``)."""
        n = len(token_ids) // self.page_size
        if max_pages is not None:
            n = min(n, max_pages)
        node = self._root(namespace)
        pages: list[int] = []
        now = next(self._clock)
        for key in self._keys(token_ids, n):
            child = node.children.get(key)
            if child is None:
                break
            child.last_access = now
            node = child
            pages.append(child.page)  # type: ignore[arg-type]
        return PrefixMatch(node, pages)

    def insert(
        self,
        namespace: str,
        token_ids: Sequence[int],
        pages: Sequence[int],
        *,
        stored: bool = False,
    ) -> tuple[PrefixHandle, list[int]]:
        """Cache ``pages`` as the KV of the full pages of ``token_ids``.

        Where the tree already holds a page for a position, it keeps its own; the returned
        list says which page the tree holds at each position, so the caller frees the pages
        of its own that were not adopted. Returns the deepest node too. ``stored`` says the
        lower tiers already have the pages (they were just restored from there); otherwise,
        under write-through, the pages the tree adopts go to ``offer`` now.
        """
        if len(token_ids) < len(pages) * self.page_size:
            raise ValueError(f"{len(pages)} pages need {len(pages) * self.page_size} tokens")
        node = self._root(namespace)
        held: list[int] = []
        adopted: list[tuple[_Node, int]] = []  # new nodes and their page's position
        now = next(self._clock)
        keys = self._keys(token_ids, len(pages))
        for i, (key, page) in enumerate(zip(keys, pages, strict=True)):
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = _Node(namespace, node, key, page, stored)
                self._pages += 1
                self._leaves.discard(node)
                self._leaves.add(child)
                adopted.append((child, i))
            child.last_access = now
            held.append(child.page)  # type: ignore[arg-type]
            node = child
        if self.write_through and self.offer is not None and not stored and adopted:
            ps = self.page_size
            self._hand_over(
                [n for n, _ in adopted], [tuple(token_ids[: (i + 1) * ps]) for _, i in adopted]
            )
        return node, held

    # --- pinning --------------------------------------------------------------------------------
    def lock(self, node: PrefixHandle) -> None:
        """Pin ``node`` and its ancestors: their pages cannot be evicted until :meth:`unlock`."""
        for n in node.path():
            if n.ref == 0:
                self._pinned += 1
            n.ref += 1

    def unlock(self, node: PrefixHandle) -> None:
        """Undo one :meth:`lock` of ``node``."""
        for n in node.path():
            n.ref -= 1
            if n.ref == 0:
                self._pinned -= 1

    # --- eviction -------------------------------------------------------------------------------
    def _evictable_leaves(self) -> list[tuple[int, int, _Node]]:
        return [(n.last_access, id(n), n) for n in self._leaves if n.ref == 0]

    def _chain(self, node: _Node) -> tuple[int, ...]:
        keys = [n.key for n in node.path()]
        return tuple(t for key in reversed(keys) for t in key)

    def evict(self, n_pages: int, *, offload: bool = True) -> int:
        """Free up to ``n_pages`` unreferenced pages, least recently used leaves first.

        With ``offload`` (and a hook) the evicted pages' token chains and KV go to the hook
        in one batch first. Returns the number of pages freed.
        """
        heap = self._evictable_leaves()
        heapq.heapify(heap)
        victims: list[_Node] = []
        outgoing: list[_Node] = []  # victims the lower tiers do not have
        chains: list[tuple[int, ...]] = []
        want_chains = offload and self.offer is not None
        while heap and len(victims) < n_pages:
            _, _, node = heapq.heappop(heap)
            if want_chains and not node.stored:
                outgoing.append(node)
                chains.append(self._chain(node))
            victims.append(node)
            parent = self._detach(node)
            if parent is not None and parent.ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        if not victims:
            return 0
        if outgoing:
            self._hand_over(outgoing, chains)
        self._free(victims)
        if offload:
            self.evicted_pages += len(victims)
        return len(victims)

    def _detach(self, node: _Node) -> _Node | None:
        """Take the leaf ``node`` out of the tree; its parent when that became a leaf."""
        parent = node.parent
        assert parent is not None
        del parent.children[node.key]
        self._leaves.discard(node)
        if parent.page is None:
            if not parent.children:
                del self._roots[parent.namespace]
            return None
        if parent.children:
            return None
        self._leaves.add(parent)
        return parent

    def _free(self, nodes: list[_Node]) -> None:
        """Give detached ``nodes``' pages back to the pool."""
        self.pool.free([n.page for n in nodes])  # type: ignore[misc]
        self._pages -= len(nodes)

    # --- one namespace at once (cold storage) ------------------------------------------------
    def unpinned(self, namespace: str) -> tuple[list[PrefixHandle], list[tuple[int, ...]], int]:
        """The pages of ``namespace`` that no running request pins, children before their
        parents, with each one's token chain (from the first token to its own last); and
        how many pages of it are pinned (they stay: a request is using them)."""
        root = self._roots.get(namespace)
        if root is None:
            return [], [], 0
        nodes: list[_Node] = []
        chains: list[tuple[int, ...]] = []
        pinned = 0
        # iterative post-order walk, carrying each node's chain
        stack: list[tuple[_Node, tuple[int, ...], bool]] = [
            (child, child.key, False) for child in root.children.values()
        ]
        while stack:
            node, chain, expanded = stack.pop()
            if expanded:
                if node.ref:
                    pinned += 1
                else:
                    nodes.append(node)
                    chains.append(chain)
                continue
            stack.append((node, chain, True))
            stack.extend((c, chain + c.key, False) for c in node.children.values())
        return nodes, chains, pinned

    def drop(self, nodes: Sequence[PrefixHandle]) -> int:
        """Free the pages of ``nodes`` (children before parents, as :meth:`unpinned` lists
        them) that are still cached, unpinned and childless, without handing them to the
        lower tiers (the caller has put them there). Nodes a request pinned, extended or
        that left the tree since they were listed are kept. Returns the pages freed."""
        gone: list[_Node] = []
        for node in nodes:
            parent = node.parent
            if parent is None or parent.children.get(node.key) is not node:
                continue
            if node.ref or node.children:
                continue
            self._detach(node)
            gone.append(node)
        if gone:
            self._free(gone)
        return len(gone)

    def _hand_over(self, nodes: list[_Node], chains: list[tuple[int, ...]]) -> None:
        """Give ``nodes``' pages (whose token chains are ``chains``) to ``offer`` in one
        batch and mark them stored."""
        assert self.offer is not None
        kv = self.pool.page_copies([n.page for n in nodes])  # type: ignore[misc]
        out = [
            OffloadPage(n.namespace, chain, kv[i])
            for i, (n, chain) in enumerate(zip(nodes, chains, strict=True))
        ]
        try:
            self.offer(out)
        except Exception:
            # A failing lower tier costs a future recompute, never the running requests.
            log.exception("the lower tiers did not take %d pages", len(out))
            return
        for n in nodes:
            n.stored = True

    def flush(self) -> int:
        """Drop every unreferenced page without offloading it; returns how many."""
        return self.evict(self._pages, offload=False)
