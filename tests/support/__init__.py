"""What the tests (and the benchmarks) share to run the service for real; not a test module.

- servers:   a uvicorn subprocess on a free loopback port: start, wait until live, stop it and
             everything it started; one-shot JSON requests to it
- polling:   wait for a condition, for warm ranks, for a check to reach a status; hold ranks
- apps:      the app in-process (a TestClient) with warm ranks
- processes: live (not zombie) processes of a session, read from /proc; ending a session
- bodies:    check request bodies several tests build the same way
- image:     the Dockerfile read as data: the final stage's CMD, HEALTHCHECK and environment
- cli:       what the CLI tests' fixtures hand the tests
- registered_models: the operator models the worker tests' shared warm app registers
- parallel:  the pytest plugin that keeps tests sharing a fixture on one xdist worker, and
             what a test must do to run beside any other (`pytest -n 3`)

Tests import it as `support` (pytest puts tests/ on sys.path for tests/conftest.py); the
benchmarks, run from the repository root, as `tests.support`. Modules here import each other
relatively so that both names work.
"""
