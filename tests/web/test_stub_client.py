"""gorge.web.site.stub_client reaches the Site treq's StubTreq builds, through the
private name gorge.app.private_names reads (``_agent._serverFactory``,
checked on its own in tests/app/test_private_names.py)."""

from twisted.web import server
from twisted.web.resource import Resource

from gorge.web.site import stub_client


class Echo(Resource):
    isLeaf = True

    def render_GET(self, request):
        return type(request).__name__.encode()


class MarkedRequest(server.Request):
    pass


def test_stub_client_serves_through_the_sites_request_factory():
    site = server.Site(Echo(), requestFactory=MarkedRequest)
    try:
        stub = stub_client(site)
    except AttributeError as e:
        raise AssertionError(f"treq's StubTreq no longer exposes its Site: {e}") from None
    response = stub.get("http://svc/")
    stub.flush()
    results = []
    response.addCallback(lambda r: r.content()).addBoth(results.append)
    stub.flush()
    assert results == [b"MarkedRequest"]
