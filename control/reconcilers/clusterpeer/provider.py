"""Provider: the peer's TokenExchangeProvider `peering-<name>` kept as the peer's offer says
(`rules.provider.desired_provider`), and what was seen of it for TokenExchangeReady (its reason is chosen by
`rules.conditions.token_exchange_condition`).

It is written only when the peer published an issuer and a JWK Set; a name taken by an object without the
module's labels is never touched; an absent TokenExchangeProvider API is waited for without a restart.
"""

from __future__ import annotations

from typing import Callable

from contract.names import provider_name
from control.apply import create_or_update
from control.kube import AlreadyExists, ApiError, Conflict, KubeSession, NotFound
from control.optional import TOKENEXCHANGEPROVIDERS, OptionalInformer
from control.rules import conditions as cond
from control.rules import offer as offer_rules
from control.rules import ownership
from control.rules import provider as provider_rules


class ProviderKeeper:
    def __init__(self, kube: KubeSession, providers: OptionalInformer, *,
                 exchange_failures: Callable[[], dict[str, tuple[str, str]]]) -> None:
        self.kube = kube
        self.providers = providers
        self.exchange_failures = exchange_failures

    async def keep(self, cp: dict, *, peer: dict | None, own_uuid: str,
                   effective: list[str]) -> cond.Cond:
        """Write the provider if it differs and return TokenExchangeReady."""
        key = cp["metadata"]["name"]
        name = provider_name(key)
        issuer = (peer or {}).get("issuer") or {}
        resource = self.providers.resource
        if resource is None:
            return cond.token_exchange_condition(cond.ProviderObservation(
                api_absent=TOKENEXCHANGEPROVIDERS.absent_message()))
        existing = self.providers.get(name)
        ours = existing is None or ownership.belongs_to(existing, key)
        if not issuer.get("url") or not issuer.get("jwks"):
            return cond.token_exchange_condition(cond.ProviderObservation(obj=existing, issuer_published=False,
                                                                          ours=ours))
        problem = offer_rules.jwks_problem(issuer["jwks"])
        if problem is not None:
            return cond.token_exchange_condition(cond.ProviderObservation(obj=existing, jwks_problem=problem,
                                                                          ours=ours))
        if not ours:
            return cond.token_exchange_condition(cond.ProviderObservation(obj=existing, ours=False))
        want = provider_rules.desired_provider(cp, local_uuid=own_uuid,
                                               issuer_url=issuer["url"], jwks=issuer["jwks"], effective=effective,
                                               api_version=resource.api_version)
        try:
            obj = (await create_or_update(self.kube, resource, want, current=existing)).obj
        except AlreadyExists:
            obj = None  # our own create lags in the cache, or a foreign one appeared: the next pass tells
        except Conflict:
            obj = existing
        except NotFound:
            # The API went away between discovery and the write: ask discovery again now.
            self.providers.poke()
            return cond.token_exchange_condition(cond.ProviderObservation(
                api_absent=TOKENEXCHANGEPROVIDERS.absent_message()))
        except ApiError as exc:
            return cond.token_exchange_condition(cond.ProviderObservation(
                api_error=f"{exc.code} {exc.reason}: {exc.message[:300]}"))
        return cond.token_exchange_condition(cond.ProviderObservation(
            obj=obj, ours=True, exchange_failure=self.exchange_failures().get(name)))
