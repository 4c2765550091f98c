"""`kvgate bench`: benchmarks that print their figures and write them under docs/benchmarks/.

One module per benchmark (`engine`, `gateway`, `tiers`, `sglang`, and the `multiturn`
package), their report helpers (`output`, `tiers_report`), and the stand-ins they run
against where the real part cannot run here: `stub_upstream` (an OpenAI-shaped upstream,
not a model) and `hicache_pool` (SGLang's host KV pool on CPU tensors).
"""
