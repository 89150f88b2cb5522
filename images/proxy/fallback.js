// Fallback model (docs/gateway.md, "Fallback model"): when the router cannot answer a request for a model name
// because no backend of that name answers, the gateway's front door sends the request once more to the router under
// the recipe's fallback name for it. Loaded only by the front door of a gateway whose recipe names fallback pairs
// (templates/gateway-front-door.conf.j2); the routing stays the router's (SMG picks the fallback's backend).
//
// - route (js_content of the client routes): a request whose body names a model with a fallback goes to the
//   location that intercepts the router's 404 (no backend serves the name: drained, or never registered) and 5xx
//   (the backend it chose did not answer) and resends; every other request to the location that passes the router's
//   answer on as every route does. Both are named locations of the same config.
// - body (js_set $ds4_fallback_body, read by proxy_set_body in the resending location): the request body with its
//   model replaced by the fallback name; $ds4_fallback_to records the name for the access log.
//
// The pairs come from the render, as the JSON object in $ds4_fallback (model -> fallback model). Names are recipe
// model names (ds4deploy/recipe/schema.py MODEL_NAME_RE: no quote, backslash or $). A body the front door keeps in
// a file (larger than client_body_buffer_size) cannot be read here: it is routed without fallback.
//
// njs 0.7.9 (Debian bookworm's libnginx-mod-http-js; js_content, js_set, r.requestText, r.internalRedirect in
// https://nginx.org/en/docs/njs/reference.html).

function target(r) {
    var pairs = JSON.parse(r.variables.ds4_fallback);
    var text = r.requestText;
    // Parse only a body that names a model with a fallback somewhere (a Claude Code body is often megabytes, and
    // the door's one worker parses it while every other stream waits).
    if (!text || !Object.keys(pairs).some(function (m) { return text.indexOf('"' + m + '"') >= 0; })) {
        return null;
    }
    var request = JSON.parse(text);
    if (request === null || typeof request !== "object" || typeof request.model !== "string" ||
        !Object.prototype.hasOwnProperty.call(pairs, request.model)) {
        return null;
    }
    return {request: request, to: pairs[request.model]};
}

function route(r) {
    var api = r.uri.indexOf("/v1/messages") === 0 ? "anthropic" : "openai";
    var found = null;
    try {
        found = target(r);
    } catch (e) {
        found = null;  // not JSON, or the body is in a file: the router answers it as it is
    }
    r.internalRedirect((found ? "@fallback_" : "@router_") + api);
}

function body(r) {
    try {
        var found = target(r);
        found.request.model = found.to;
        r.variables.ds4_fallback_to = found.to;
        return JSON.stringify(found.request);
    } catch (e) {
        return r.requestText;  // cannot happen after route() chose the fallback; never an empty body to the router
    }
}

export default {route: route, body: body};
