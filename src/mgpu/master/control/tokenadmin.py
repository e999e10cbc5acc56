"""The controller's tokens and audit trail (a part of `Cluster`, which it is mixed into):
every token made or revoked is audited, as is every admin action the controller takes."""

from __future__ import annotations

from typing import Any

from mgpu.master.control.jobctl import Actor
from mgpu.master.security.auth import TokenStore
from mgpu.master.store.base import Store

__all__ = ["TokensAndAudit"]


class TokensAndAudit:
    store: Store
    tokens: TokenStore

    def create_token(
        self, user: str, admin: bool, allow_root: bool, actor: Actor
    ) -> tuple[str, str]:
        """A new token (its id and secret), audited."""
        token_id, token = self.tokens.create(user, admin, allow_root=allow_root)
        detail = f"id {token_id}" + (" admin" if admin else "")
        detail += " allow-root" if allow_root else ""
        self.audit("token_create", actor.user, actor.address, user, detail)
        return token_id, token

    def list_tokens(self) -> list[dict[str, Any]]:
        return self.tokens.list()

    def token_guarded(self, token_id: str) -> str | None:
        """What the token is, when only the cluster's owner may revoke it."""
        return self.tokens.guarded(token_id)

    def revoke_token(self, token_id: str, actor: Actor) -> bool:
        revoked = self.tokens.revoke(token_id)
        if revoked:
            self.audit("token_revoke", actor.user, actor.address, token_id)
        return revoked

    def audit(
        self,
        kind: str,
        actor: str | None,
        address: str | None,
        target: str | None = None,
        detail: str | None = None,
    ) -> None:
        """One audit event, written now."""
        self.store.record_event(kind, actor=actor, address=address, target=target, detail=detail)

    def audit_rows(
        self, rows: list[tuple[str, str | None, str | None, str | None, str | None]]
    ) -> None:
        """Audit events (kind, actor, address, target, detail) in one transaction."""
        self.store.record_events(rows)

    def audit_events(self, since: float) -> list[dict[str, Any]]:
        return self.store.events(since=since)
