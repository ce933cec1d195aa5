"""The API server's own answer for `gpu-operator adopt`: dry runs of the operator's first write
of every operand object it would take over (the takeover patch or the forced apply), so that the
report shows what the server would accept before anything is written."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightkube import ApiError
from lightkube.types import PatchType

from gpu_operator.kube import resources
from gpu_operator.operands import adoption, takeover


def _key(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return (str(obj.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name")))


async def _trial(client: Any, obj: dict[str, Any], live: dict[str, Any] | None) -> Any:
    """The API server's answer to a dry run of the operator's first write of `obj`: the
    takeover patch when a previous writer still owns fields of it (operands/takeover.py), else
    the forced apply. A resourceVersion test that fails (a status write got in between) is
    retried with the object read again."""
    meta = obj["metadata"]
    namespace = (
        meta.get("namespace")
        if resources.kind_of(obj["apiVersion"], obj["kind"]).namespaced
        else None
    )
    for _ in range(5):
        change = takeover.plan(obj, live) if live is not None else None
        try:
            if change is None or change.patch is None:
                result = dict(await client.apply(resources.wrap(obj), force=True, dry_run=True))
                return adoption.Trial(result=result)
            assert live is not None
            found = dict(
                await client.patch(
                    resources.of(live), meta["name"], change.patch, namespace=namespace,
                    patch_type=PatchType.JSON, dry_run=True,
                )
            )  # fmt: skip
        except ApiError as err:
            message = str(err.status.message or err)
            if err.status.code == 422 and "test failed" in message and live is not None:
                live = await _read_again(client, live)
                continue
            if err.status.code in (400, 409, 422):
                return adoption.Trial(rejected=message)
            raise
        # The patch changes the content only; the apply after it sets our metadata.
        found_meta = dict(found.get("metadata") or {})
        for name in ("labels", "annotations"):
            found_meta[name] = {**(found_meta.get(name) or {}), **(meta.get(name) or {})}
        found_meta["ownerReferences"] = meta.get("ownerReferences")
        return adoption.Trial(result={**found, "metadata": found_meta})
    return None


async def _read_again(client: Any, obj: Mapping[str, Any]) -> dict[str, Any] | None:
    meta = obj.get("metadata") or {}
    fields = {"metadata.name": str(meta.get("name"))}
    res = resources.of(dict(obj))
    if meta.get("namespace"):
        listing = client.list(res, namespace=meta["namespace"], fields=fields)
    else:
        listing = client.list(res, fields=fields)
    found = [dict(o) async for o in listing]
    return found[0] if found else None


async def run_trials(
    client: Any, desired: list[dict[str, Any]], live: list[dict[str, Any]]
) -> tuple[dict[tuple[str, str, str], adoption.Trial], list[str]]:
    """Dry runs of the operator's first write of every desired object (not of DaemonSets whose
    selector must be replaced, nor of objects another owner controls: those the plan decides)."""
    by_key = {_key(o): o for o in live}
    trials: dict[tuple[str, str, str], adoption.Trial] = {}
    for obj in desired:
        found = by_key.get(_key(obj))
        if found is not None and adoption.plan_object(obj, found).verdict in ("replace", "blocked"):
            continue
        try:
            trial = await _trial(client, obj, found)
        except ApiError as err:
            if err.status.code == 403:
                note = (
                    f"the API server was not asked about the writes ({err.status.message}): "
                    "verdicts are the planner's model; run adopt with rights to patch the "
                    "operand objects for the server's own answer"
                )
                return {}, [note]
            raise
        if trial is not None:
            trials[_key(obj)] = trial
    return trials, []
