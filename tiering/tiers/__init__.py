"""The tiers below the GPU, one module each, all behind :class:`tiering.tiers.base.Tier`."""
