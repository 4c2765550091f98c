"""The one typed settings object, read from the environment and an optional ``kvgate.toml``.

Precedence (highest first): explicit constructor arguments, environment variables
(``KVGATE_<FIELD>``, plus the conventional ``DATABASE_URL`` and ``AWS_*`` names), the TOML
file named by ``KVGATE_CONFIG`` (default ``./kvgate.toml``), then the defaults below.
Packages below ``kvgate`` never read this object: the composition root maps it onto each
package's own small config types, so that ``gateway``, ``workers`` and ``tiering`` stay
importable on their own.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)


def _config_file() -> Path:
    return Path(os.environ.get("KVGATE_CONFIG", "kvgate.toml"))


class Settings(BaseSettings):
    """Everything a kvgate process can be told. Field ``foo`` is set by ``KVGATE_FOO``."""

    model_config = SettingsConfigDict(env_prefix="KVGATE_", extra="forbid", populate_by_name=True)

    # --- local state -----------------------------------------------------------------------------
    home: Path = Field(Path(".kvgate"), description="Directory holding all local state.")

    # --- Postgres --------------------------------------------------------------------------------
    database_url: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("DATABASE_URL", "KVGATE_DATABASE_URL", "database_url"),
        description="Postgres DSN; unset means an embedded PostgreSQL in $KVGATE_HOME/pg.",
    )
    db_pool_min: int = Field(1, ge=0, description="Minimum connections per asyncpg pool.")
    db_pool_max: int = Field(10, ge=1, description="Maximum connections per asyncpg pool.")

    # --- object store (S3) -----------------------------------------------------------------------
    s3_endpoint: str | None = Field(
        None,
        validation_alias=AliasChoices("KVGATE_S3_ENDPOINT", "AWS_ENDPOINT_URL", "s3_endpoint"),
        description="S3 endpoint URL; unset means `kvgate up` starts SeaweedFS locally.",
    )
    s3_access_key: SecretStr = Field(
        SecretStr("kvgate"),
        validation_alias=AliasChoices("KVGATE_S3_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "s3_access_key"),
        description="S3 access key id.",
    )
    s3_secret_key: SecretStr = Field(
        SecretStr("kvgate-secret"),
        validation_alias=AliasChoices(
            "KVGATE_S3_SECRET_KEY", "AWS_SECRET_ACCESS_KEY", "s3_secret_key"
        ),
        description="S3 secret access key.",
    )
    s3_region: str = Field("us-east-1", description="S3 region name.")
    s3_bucket: str = Field("kvgate", description="Bucket holding KV blocks (L4).")
    s3_prefix: str = Field("kv/", description="Key prefix inside the bucket.")

    # --- NAS (L3) --------------------------------------------------------------------------------
    nas_path: Path | None = Field(
        None, description="NAS directory (an NFS mount in production); default $KVGATE_HOME/nas."
    )

    # --- KV tiering: host RAM, NAS, object store, tierd ------------------------------------------
    tier_host_bytes: int = Field(1 << 30, ge=0, description="Host-RAM (L2) KV budget in bytes.")
    tier_write_queue_pages: int = Field(
        4096, gt=0, description="Evicted pages waiting for the NAS; beyond this they are dropped."
    )
    tier_write_through: bool = Field(
        True,
        description="Send a request's KV pages down the tiers as they are computed (its "
        "prompt's once prefilled, the rest when it ends), so any worker can resume the "
        "conversation; off: only when the device pool evicts them.",
    )
    tier_nas_fsync: bool = Field(True, description="fsync each NAS block before its rename.")
    tier_nas_high_bytes: int = Field(
        10 << 30,
        ge=0,
        description="Above this tierd demotes the NAS's coldest pages to S3, down to the low "
        "watermark; checked every KVGATE_TIERD_WATERMARK_CHECK_S, so the NAS goes over it only "
        "by what the workers write before the demotion catches up, at most to "
        "KVGATE_TIER_NAS_MAX_BYTES (0 = no limit).",
    )
    tier_nas_low_bytes: int = Field(
        8 << 30, ge=0, description="...down to this many bytes on the NAS."
    )
    tier_nas_max_bytes: int = Field(
        0,
        ge=0,
        description="Hard cap on the NAS's bytes (per the ledger): a worker writes no page that "
        "would take the NAS above it; such a page stays in host RAM only, counted as "
        "write_full. Set it above KVGATE_TIER_NAS_HIGH_BYTES, so that tierd demotes before "
        "writers reach it (0 = no cap).",
    )
    tier_object_max_bytes: int = Field(
        0, ge=0, description="tierd deletes the coldest S3 pages above this (0 = no limit)."
    )
    tier_object_concurrency: int = Field(32, gt=0, description="S3 requests in flight per process.")
    tier_object_max_attempts: int = Field(
        4, gt=0, description="Tries per S3 request (backoff on throttling, 5xx, timeouts)."
    )
    tier_object_timeout_s: float = Field(10.0, gt=0, description="S3 read timeout per try.")
    tier_retention_s: float = Field(
        0.0, ge=0, description="Delete pages idle longer than this from every tier (0 = keep)."
    )
    tier_namespace_quota_bytes: int = Field(
        0, ge=0, description="Bytes one namespace (tenant + model) may keep (0 = no quota)."
    )
    tier_deadline_nas_s: float = Field(2.0, gt=0, description="Longest a NAS fetch may take.")
    tier_deadline_object_s: float = Field(5.0, gt=0, description="Longest an S3 fetch may take.")
    tier_ledger_timeout_s: float = Field(
        0.5, gt=0, description="Longest a ledger query may take on the serving path."
    )
    tierd_interval_s: float = Field(30.0, gt=0, description="Seconds between tierd passes.")
    tierd_watermark_check_s: float = Field(
        1.0,
        ge=0,
        description="Between passes, seconds between checks of the NAS's bytes against the high "
        "watermark; above it a pass starts at once (0 = only every pass).",
    )
    tierd_reconcile_interval_s: float = Field(
        600.0,
        gt=0,
        description="Seconds between tierd's walks of the whole NAS and bucket against the ledger.",
    )
    tierd_orphan_grace_s: float = Field(
        600.0, ge=0, description="Age before tierd deletes a block that has no ledger row."
    )

    # --- gateway ---------------------------------------------------------------------------------
    gateway_trusted_proxies: list[str] = Field(
        default_factory=list,
        description='CIDRs whose X-Forwarded-For is believed (JSON list, e.g. ["10.0.0.0/8"]).',
    )
    gateway_free_share: float = Field(
        0.3, ge=0, le=1, description="Most of the workers' capacity free-tier requests may use."
    )
    gateway_body_limit: int = Field(
        1 << 20, gt=0, description="Largest request body in bytes (larger gets 413)."
    )
    gateway_usage_flush_s: float = Field(
        0.5, gt=0, le=1, description="Seconds between batched usage writes."
    )
    gateway_auth_cache_ttl_s: float = Field(
        2.0, ge=0, le=4, description="Seconds a key lookup is trusted (a revoke lands within it)."
    )
    gateway_worker_timeout_s: float = Field(
        5.0, gt=0, description="Workers silent for longer than this get no traffic."
    )
    gateway_upstream_timeout_s: float = Field(
        600.0, gt=0, description="Longest a worker may take to answer one request."
    )

    # --- processes started by `kvgate up` --------------------------------------------------------
    bind_host: str = Field(
        "127.0.0.1", description="Address the gateway, worker and tierd's /metrics bind to."
    )
    gateway_port: int = Field(8000, description="Gateway HTTP port.")
    worker_port: int = Field(30000, description="Built-in worker HTTP port.")
    tierd_metrics_port: int = Field(
        30100, ge=0, le=65535, description="Port of tierd's Prometheus /metrics (0: none)."
    )
    prometheus_port: int = Field(
        9090, ge=1, le=65535, description="Port of the Prometheus `kvgate up --monitoring` runs."
    )

    # --- the built-in worker, `kvgate worker` ---------------------------------------------------
    worker_model: str | None = Field(
        None,
        description="GGUF file, safetensors directory, `tiny-random` or `random:<preset>` "
        "(`random:llama-3.1-8b`: seeded random weights at a real size, for benchmarks); unset "
        "means SmolLM2-135M-Instruct (fetched once), served as `smollm2-135m-instruct`.",
    )
    worker_tokenizer: Path | None = Field(
        None,
        description="Tokenizer of a random model: a GGUF file or a directory written by "
        "`kvgate models export-tokenizer`; unset means SmolLM2's (fetched once).",
    )
    worker_kv_pool_bytes: int = Field(
        256 * 2**20, gt=0, description="Bytes of the device KV pool (the 'VRAM' tier)."
    )
    worker_page_size: int = Field(16, gt=0, description="Tokens per KV page.")
    worker_max_batch: int = Field(32, gt=0, description="Most requests decoding at once.")
    worker_token_budget: int = Field(
        2048, gt=0, description="Most tokens (prefill chunks + decode) in one engine step."
    )
    worker_device: str = Field("auto", description="torch device; auto = cuda if available.")
    worker_dtype: str = Field(
        "auto", description="float32, bfloat16, float16 or auto (fp32 on CPU, bf16 on CUDA)."
    )
    worker_kv_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="dtype of the KV cache: auto (float16 on CPU, the model's dtype on CUDA), "
        "float32, bfloat16 or float16.",
    )
    worker_tiers: bool = Field(
        True, description="Spill evicted KV pages down host RAM -> NAS -> S3 and fetch them back."
    )

    # --- SGLang workers --------------------------------------------------------------------------
    sglang_python: str | None = Field(
        None,
        description="Python interpreter that has sglang installed, for `kvgate worker "
        "--engine sglang`; unset means the one running kvgate.",
    )

    # --- billing/accounts: console sign-in, email, Stripe ----------------------------------------
    public_base_url: str = Field(
        "http://127.0.0.1:8000",
        description="Where browsers reach the gateway: email links use it; https:// makes "
        "session cookies Secure.",
    )
    session_secret: SecretStr = Field(
        SecretStr(""),
        description="Keys the console's CSRF tokens; set the same value on every gateway "
        "replica (empty: random per process).",
    )
    smtp_host: str = Field("", description="SMTP server for account emails; empty logs them.")
    smtp_port: int = Field(587, description="SMTP port.")
    smtp_username: str = Field("", description="SMTP login (empty: no login).")
    smtp_password: SecretStr = Field(SecretStr(""), description="SMTP password.")
    smtp_sender: str = Field("kvgate <no-reply@localhost>", description="From: of account emails.")
    smtp_starttls: bool = Field(True, description="Upgrade the SMTP connection with STARTTLS.")
    stripe_secret_key: SecretStr = Field(
        SecretStr(""), description="Stripe API key; empty disables checkout and metering."
    )
    stripe_webhook_secret: SecretStr = Field(
        SecretStr(""), description="Signing secret of the Stripe webhook endpoint (whsec_...)."
    )
    stripe_prices: dict[str, str] = Field(
        default_factory=dict,
        description='Plan name -> Stripe price id (JSON, e.g. {"team": "price_..."}).',
    )
    stripe_metered_prices: list[str] = Field(
        default_factory=list,
        description="Metered Stripe price ids (input, cached input, output) added to subscriptions.",
    )
    stripe_meter_ids: dict[str, str] = Field(
        default_factory=dict,
        description="Meter name (input_tokens, cached_input_tokens, output_tokens) -> Stripe "
        "meter id, for `kvgate billing reconcile`.",
    )
    price_input: float = Field(
        0.50,
        ge=0,
        description="USD per million uncached input tokens on paid plans, as the pricing page "
        "shows it: the unit amount of the input metered Stripe price.",
    )
    price_cached_input: float = Field(
        0.05,
        ge=0,
        description="USD per million cached input tokens (served from a KV tier) on paid "
        "plans: the unit amount of the cached-input metered Stripe price.",
    )
    price_output: float = Field(
        1.50,
        ge=0,
        description="USD per million output tokens on paid plans: the unit amount of the "
        "output metered Stripe price.",
    )
    billing_grace_days: float = Field(
        3.0, ge=0, description="Days a team keeps paid limits after a failed payment."
    )

    # --- public site, contact sales and /admin ---------------------------------------------------
    sales_email: str = Field(
        "sales@localhost", description="Where new contact-sales leads are notified by email."
    )
    contact_form_limit: int = Field(
        5, ge=1, description="Contact-sales submissions accepted per client IP per window."
    )
    contact_form_window_s: float = Field(
        3600.0, gt=0, description="The window of contact_form_limit, in seconds."
    )
    lead_uncontacted_after_s: float = Field(
        2 * 24 * 3600.0, gt=0, description="/admin flags leads still new after this long."
    )
    benchmarks_dir: Path | None = Field(
        None,
        description="Benchmark results shown on the landing page; default the checkout's "
        "docs/benchmarks.",
    )

    # --- the `kvgate up` supervisor --------------------------------------------------------------
    ready_timeout: float = Field(
        120.0, gt=0, description="Seconds `kvgate up` waits for each part to answer its probe."
    )
    stop_timeout: float = Field(
        10.0, gt=0, description="Seconds `kvgate up` waits after SIGTERM before SIGKILL."
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml = TomlConfigSettingsSource(settings_cls, toml_file=_config_file())
        return (init_settings, env_settings, toml)

    # --- derived paths ---------------------------------------------------------------------------
    @model_validator(mode="after")
    def _nas_cap_above_watermark(self) -> Settings:
        """A NAS cap at or below the high watermark would stop the writers before tierd
        ever demotes: the NAS would fill and stay full."""
        cap, high = self.tier_nas_max_bytes, self.tier_nas_high_bytes
        if cap and not 0 < high < cap:
            raise ValueError(
                f"KVGATE_TIER_NAS_MAX_BYTES ({cap}) must be above KVGATE_TIER_NAS_HIGH_BYTES "
                f"({high}, and that not 0): tierd demotes above the high watermark, and the "
                "cap is where writers stop"
            )
        return self

    @property
    def pg_dir(self) -> Path:
        """Embedded PostgreSQL data directory."""
        return self.home / "pg"

    @property
    def s3_dir(self) -> Path:
        """Embedded SeaweedFS data directory."""
        return self.home / "s3"

    @property
    def nas_dir(self) -> Path:
        """The NAS directory actually used."""
        return self.nas_path if self.nas_path is not None else self.home / "nas"

    @property
    def models_dir(self) -> Path:
        """Where pulled model files are cached."""
        return self.home / "models"

    def masked(self) -> dict[str, Any]:
        """The effective settings as plain values, secrets replaced by ``********``.

        ``database_url`` stays readable (which server, which database) with only its
        password masked, because "which database am I on" is what people check.
        """
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if name == "database_url" and value is not None:
                value = mask_url_password(value.get_secret_value())
            elif isinstance(value, SecretStr):
                value = "********" if value.get_secret_value() else ""
            elif isinstance(value, Path):
                value = str(value)
            out[name] = value
        return out


def mask_url_password(url: str) -> str:
    """``url`` with its password (in the user part or a ``password=`` query item) as ``****``."""
    parts = urlsplit(url)
    netloc = parts.netloc
    userinfo, at, hostinfo = netloc.rpartition("@")
    if at and ":" in userinfo:
        user, _, password = userinfo.partition(":")
        if password:
            netloc = f"{user}:****@{hostinfo}"
    query = parts.query
    items = parse_qsl(query, keep_blank_values=True)
    if any(key == "password" for key, _ in items):
        masked = [(k, "****" if k == "password" else v) for k, v in items]
        query = urlencode(masked, safe="/:*")
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def load_settings(**overrides: Any) -> Settings:
    """Read the settings; ``overrides`` win over every other source."""
    return Settings(**overrides)
