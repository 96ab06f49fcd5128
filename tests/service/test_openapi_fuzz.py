"""Schemathesis over the OpenAPI schema of a running server: no input may cause a 5xx."""

import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.service.conftest import ServerThread

EXAMPLES_PER_OPERATION = 40


def test_no_generated_input_causes_a_server_error(server: ServerThread) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/search/text", "/search/image", "/search/embedding"}
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        def no_server_error(case) -> None:
            response = case.call(timeout=30)
            assert response.status_code < 500, (
                f"{case.method} {case.path} -> {response.status_code}: {response.text[:500]}"
            )
            assert "Traceback" not in response.text

        no_server_error()
