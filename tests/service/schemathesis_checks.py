"""Schemathesis hooks (SCHEMATHESIS_HOOKS): two built-in checks minus what no request shows.

positive_data_acceptance: everything the service checks is in its OpenAPI schema except
rules JSON Schema cannot state: shortlist >= k (a comparison of two fields; documented in the
field and the 422), that an uploaded file (or a picture added to the gallery) must be a
decodable image of at most max_image_pixels pixels, and that a multipart form's `filter` is
JSON text for a filter object (a form field's content is not validated against a schema). A
schema-valid request rejected for any other reason fails as it would in the built-in check.

negative_data_rejection: a multipart case whose only mutation is an empty list sends no part
at all for that field, so the request on the wire is valid; it is skipped. Every other
schema-violating request must still get a 4xx.
"""

import schemathesis
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

IMAGE_CONTENT_ERRORS = {"unsupported_media_type", "invalid_image", "image_too_large"}


def _error_code(response) -> str:
    try:
        return str(response.json().get("error", ""))
    except ValueError:
        return ""


def _documented_unschematic_rule(response, case) -> bool:
    if response.status_code == 422 and "it must be >= k" in response.text:
        return True
    multipart = (case.media_type or "").startswith("multipart/")
    if multipart and response.status_code == 422 and '"filter' in response.text:
        return True
    images = ("/search/image", "/v1/items")
    return case.path in images and _error_code(response) in IMAGE_CONTENT_ERRORS


@schemathesis.check
def positive_data_acceptance_except_cross_field_rules(ctx, response, case):
    """positive_data_acceptance, except the two rules above."""
    if _documented_unschematic_rule(response, case):
        return None
    return positive_data_acceptance(ctx, response, case)


def _vanishes_in_multipart(case) -> bool:
    """A multipart body with an empty list or object: serialised as no part at all."""
    body = case.body if isinstance(case.body, dict) else {}
    return (case.media_type or "").startswith("multipart/") and any(
        isinstance(value, list | dict) and not value for value in body.values()
    )


@schemathesis.check
def negative_data_rejection_of_what_is_sent(ctx, response, case):
    """negative_data_rejection, except multipart mutations that vanish when serialised."""
    if _vanishes_in_multipart(case):
        return None
    return negative_data_rejection(ctx, response, case)
