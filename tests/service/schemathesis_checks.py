"""Schemathesis hooks (SCHEMATHESIS_HOOKS): positive-data acceptance minus what no schema says.

Everything the service checks is in its OpenAPI schema except two rules JSON Schema cannot
state: shortlist >= k (a comparison of two fields; documented in the field and the 422) and
that an uploaded file must be a decodable image of at most max_image_pixels pixels. A
schema-valid request rejected for any other reason fails as it would in the built-in check.
"""

import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance

IMAGE_CONTENT_ERRORS = {"unsupported_media_type", "invalid_image", "image_too_large"}


def _error_code(response) -> str:
    try:
        return str(response.json().get("error", ""))
    except ValueError:
        return ""


def _documented_unschematic_rule(response, case) -> bool:
    if response.status_code == 422 and "it must be >= k" in response.text:
        return True
    return case.path == "/search/image" and _error_code(response) in IMAGE_CONTENT_ERRORS


@schemathesis.check
def positive_data_acceptance_except_cross_field_rules(ctx, response, case):
    """positive_data_acceptance, except the two rules above."""
    if _documented_unschematic_rule(response, case):
        return None
    return positive_data_acceptance(ctx, response, case)
