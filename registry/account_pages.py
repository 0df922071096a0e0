"""Pages of the operator's tenants and price plans and of a tenant's API keys (keyset pagination,
registry/pages.py).

Orders (each unique, each served by an index):
- tenants oldest first, by (created_at, id) (ix_tenants_created_at_id, migration 0022);
- price plans by name (the unique constraint on price_plans.name); the cursor is a plan's id;
- a tenant's keys newest first, by (created_at, id) descending (ix_api_keys_tenant_created, migration 0022).
A key cursor is one of the tenant's own key ids; any other id is the one InvalidCursorError.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.models import ApiKey, PricePlan, Tenant
from registry.pages import Page, PageRequest, anchor_key, read_page

TENANT_KEYS = (Tenant.created_at, Tenant.id)
API_KEY_KEYS = (ApiKey.created_at, ApiKey.id)
PRICE_PLAN_KEYS = (PricePlan.name,)


def tenant_page(session: Session, page: PageRequest) -> Page[Tenant]:
    """All tenants, oldest first."""
    anchor = anchor_key(session, page, TENANT_KEYS, Tenant.id, [])
    return read_page(session, select(Tenant), TENANT_KEYS, anchor, page.limit)


def api_key_page(session: Session, tenant_id: str, page: PageRequest) -> Page[ApiKey]:
    """The tenant's keys (revoked ones too), newest first."""
    scope = [ApiKey.tenant_id == tenant_id]
    anchor = anchor_key(session, page, API_KEY_KEYS, ApiKey.id, scope)
    query = select(ApiKey).where(*scope)
    return read_page(session, query, API_KEY_KEYS, anchor, page.limit, is_descending=True)


def price_plan_page(session: Session, page: PageRequest) -> Page[PricePlan]:
    """All price plans, by name."""
    anchor = anchor_key(session, page, PRICE_PLAN_KEYS, PricePlan.id, [])
    return read_page(session, select(PricePlan), PRICE_PLAN_KEYS, anchor, page.limit)
