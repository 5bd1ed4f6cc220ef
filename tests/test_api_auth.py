"""Bearer tokens against a real server: 401 without a known token, 403 with too little
scope, tokens created and revoked by an admin, health and docs open."""

from __future__ import annotations

import httpx
from api_support import Api


def test_requests_without_a_known_token_are_401(api: Api) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer sp_not-a-token"},
        {"Authorization": "Basic eDp5"},
    ):
        r = httpx.get(f"{api.base_url}/api/v1/jobs", headers=headers, timeout=10)
        assert r.status_code == 401, r.text
        assert r.json()["error"]["code"] == "unauthenticated"
        assert "token" in r.json()["error"]["message"]
        assert r.headers["WWW-Authenticate"] == "Bearer"
    # Authentication comes before validating the body.
    r = httpx.post(f"{api.base_url}/api/v1/jobs", json={}, timeout=10)
    assert r.status_code == 401


def test_scopes_read_operate_admin(api: Api) -> None:
    with api.client() as admin:
        secrets = {}
        for scope in ("read", "operate"):
            r = admin.post("/api/v1/tokens", json={"name": f"test {scope}", "scopes": [scope]})
            assert r.status_code == 201, r.text
            assert r.json()["scopes"] == [scope]
            assert r.json()["token"].startswith("sp_")
            secrets[scope] = r.json()["token"]

        listed = admin.get("/api/v1/tokens").json()["items"]
        assert {"test read", "test operate"} <= {t["name"] for t in listed}
        assert all("token" not in t and "token_hash" not in t for t in listed)

        with api.client(secrets["read"]) as reader:
            assert reader.get("/api/v1/jobs").status_code == 200
            r = reader.post("/api/v1/jobs", json={"name": "x", "job": "examples.wordcount:build"})
            assert r.status_code == 403
            assert r.json()["error"]["code"] == "forbidden"
            assert "'operate'" in r.json()["error"]["message"]
            assert reader.delete("/api/v1/jobs/1").status_code == 403
            assert reader.post("/api/v1/jobs/1/scale", json={}).status_code == 403
            assert reader.get("/api/v1/tokens").status_code == 403

        with api.client(secrets["operate"]) as operator:
            assert operator.get("/api/v1/jobs").status_code == 200
            r = operator.post("/api/v1/jobs", json={"name": "x", "job": "examples.nope:build"})
            assert r.status_code == 422  # past authorization, refused for its content
            r = operator.post("/api/v1/tokens", json={"name": "y", "scopes": ["admin"]})
            assert r.status_code == 403
            assert "'admin'" in r.json()["error"]["message"]

        r = admin.post("/api/v1/tokens", json={"name": "bad", "scopes": ["root"]})
        assert r.status_code == 422
        assert "body.scopes.0" in r.json()["error"]["message"]

        read_id = next(t["id"] for t in listed if t["name"] == "test read")
        assert admin.delete(f"/api/v1/tokens/{read_id}").status_code == 204
        assert admin.delete(f"/api/v1/tokens/{read_id}").status_code == 404
        with api.client(secrets["read"]) as revoked:
            assert revoked.get("/api/v1/jobs").status_code == 401


def test_health_and_openapi_need_no_token(api: Api) -> None:
    assert httpx.get(f"{api.base_url}/healthz", timeout=10).status_code == 200
    spec = httpx.get(f"{api.base_url}/openapi.json", timeout=10).json()
    assert "/api/v1/jobs/{job_id}/reconfigurations" in spec["paths"]
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_docs_work_with_no_internet(api: Api) -> None:
    """/docs and /redoc load their scripts and styles from the app itself, not from a CDN."""
    import re

    for page in ("/docs", "/redoc"):
        html = httpx.get(f"{api.base_url}{page}", timeout=10)
        assert html.status_code == 200
        assert "cdn.jsdelivr.net" not in html.text and "unpkg.com" not in html.text
        assets = re.findall(r'(?:src|href)="([^"]+\.(?:js|css))"', html.text)
        assert assets, f"{page} references no script or style"
        for asset in assets:
            assert asset.startswith("/"), f"{page} loads {asset} from elsewhere"
            assert httpx.get(f"{api.base_url}{asset}", timeout=10).status_code == 200, asset
