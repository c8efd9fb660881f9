"""Profile -> build -> bundle: board profiles (data), the board sysroot, the build (plan, compile,
checks, assemble), the bundle and its manifest, and running a bundle here (emulate).

Above engine and synthetic (a profile's `engine:` section is the engine's settings table; a bundle
carries the quick-gate fixtures); below fleet, proof, bench and the CLI.
"""
