"""The weight-update groups one engine has joined, and its weight-update session.

Owns ``UpdateGroups``: what SGLang 0.5.23 keeps for ``/init_weights_update_group``,
``/destroy_weights_update_group``, ``/begin_weight_update``, ``/end_weight_update`` and
the receiving half of ``/update_weights_from_distributed`` (its model runner's
``_model_update_group`` dict and its scheduler's ``_session``), over
``kernel.weight_group``. The HTTP routes are ``engine.distributed``.

Every operation returns SGLang's success message or raises a ``LegoError`` carrying its
failure message, word for word where a client may read it
(``model_runner_components/weight_updater.py:100-157,260-298``,
``scheduler_components/weight_updater.py:187-336``):

- ``init``: the worker joins as rank ``rank_offset`` (one TP rank); it blocks until every
  rank of the group has joined. A group name already held fails as torch's helper does.
- ``receive`` needs an open session (0.5.23 refuses the update otherwise, before any
  broadcast) and a joined group; it allocates what the metadata describes, one tensor per
  name or one ``flattened_bucket``, and waits for rank 0's broadcast.
- ``destroy`` leaves the group; a broadcast still waiting in it fails at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import torch

from kernel.errors import InvalidRequest, LegoError
from kernel.weight_group import (
    GroupAddress,
    TensorSpec,
    WeightGroup,
    empty_bucket,
    torch_dtype,
    unflatten,
)

NO_SESSION = (
    "update_weights_from_distributed must run between begin_weight_update() and end_weight_update()"
)


class UpdateGroups:
    def __init__(self) -> None:
        self._groups: dict[str, WeightGroup] = {}
        self._joining: set[str] = set()
        self._session_open = False

    async def init(self, address: GroupAddress, rank: int, timeout_s: float) -> str:
        if not address.group_name:
            raise InvalidRequest("Group name cannot be empty")
        name = address.group_name
        if address.backend != "gloo":
            raise _init_failed(
                f"the local engine runs on the CPU: backend must be 'gloo', not {address.backend!r}"
            )
        if name in self._groups or name in self._joining:
            raise _init_failed(
                "The specified group name has already been created, please use a different "
                "group name"
            )
        self._joining.add(name)
        try:
            group = await asyncio.to_thread(WeightGroup.join, address, rank, timeout_s)
        except LegoError as exc:
            raise _init_failed(exc.message) from exc
        finally:
            self._joining.discard(name)
        self._groups[name] = group
        return "Succeeded to initialize custom process group."

    def destroy(self, name: str) -> str:
        group = self._groups.pop(name, None)
        if group is None:
            raise InvalidRequest("The group to be destroyed does not exist.")
        group.close()
        return "Succeeded to destroy custom process group."

    def begin(self) -> str:
        if self._session_open:
            raise InvalidRequest(
                "a weight-update session is already open; call end_weight_update() first"
            )
        self._session_open = True
        return "Success"

    def end(self) -> str:
        if not self._session_open:
            raise InvalidRequest(
                "no weight-update session is open; call begin_weight_update() first"
            )
        self._session_open = False
        return "Success"

    async def receive(
        self, group_name: str, specs: Sequence[TensorSpec], load_format: str | None
    ) -> list[tuple[str, torch.Tensor]]:
        """The broadcast tensors, named; raises with SGLang's message on failure."""
        if not self._session_open:
            raise InvalidRequest(NO_SESSION)
        try:
            group = self._groups.get(group_name)
            if group is None:
                raise InvalidRequest(
                    f"Group {group_name} not in {list(self._groups)}. "
                    "Please call `init_weights_update_group` first."
                )
            if load_format == "flattened_bucket":
                bucket = empty_bucket(specs)
                await asyncio.to_thread(group.broadcast, [bucket])
                return unflatten(bucket, specs)
            # Anything else is SGLang's default: one broadcast per tensor.
            for spec in specs:
                if any(dim < 0 for dim in spec.shape):
                    raise InvalidRequest(f"Negative dimension in {spec.name}: {spec.shape}")
            tensors = [torch.empty(s.shape, dtype=torch_dtype(s.dtype)) for s in specs]
            await asyncio.to_thread(group.broadcast, tensors)
            return [(s.name, t) for s, t in zip(specs, tensors, strict=True)]
        except LegoError as exc:
            raise InvalidRequest(f"Failed to receive weights: {exc.message}") from exc

    def close_all(self) -> None:
        for name in list(self._groups):
            self._groups.pop(name).close()


def _init_failed(why: str) -> InvalidRequest:
    return InvalidRequest(f"Failed to initialize custom process group: {why}.")
