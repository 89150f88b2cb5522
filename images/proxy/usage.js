// Token counts for the gateway's access log (docs/gateway.md, "Usage per person"): a body filter of the gateway's
// front door (templates/gateway-front-door.conf.j2, js_body_filter) reads the token counts the backend itself
// reported in its answer as the answer streams past, unchanged and unbuffered, and leaves them in $ds4_tokens_in and
// $ds4_tokens_out for the log line. Nothing else of the body is kept or logged.
//
// Where the counts are (each engine's own answer; nothing is counted here):
// - OpenAI API: "usage": {"prompt_tokens": N, "completion_tokens": M, ...} in a whole answer, and in a stream's
//   last chunk when the engine sends one (vLLM only with stream_options.include_usage; llama-server always).
// - Anthropic API: "usage": {"input_tokens": N, "output_tokens": M, ...} in a whole answer; in a stream,
//   message_start carries input_tokens and message_delta the final output_tokens.
// Only the fields of a "usage" object count (one level of nesting inside it, as its *_details objects): a field of
// that name elsewhere (a tool call's input object in a whole Anthropic answer is not escaped) is not a count. Inside
// generated text every quote is escaped (RFC 8259, section 7), so the pattern cannot match there. Counts only grow
// within one answer (a stream's later usage is cumulative), so the largest seen is the answer's.
// /v1/messages/count_tokens counts a prompt that is not served: its answer is not counted.
//
// njs 0.7.9 (Debian bookworm's libnginx-mod-http-js): each request runs in its own copy of this module, so `tail`
// belongs to one answer (https://nginx.org/en/docs/njs/reference.html, "r.sendBuffer()"; and js_body_filter in
// https://nginx.org/en/docs/http/ngx_http_js_module.html).

var FIELD = {
    prompt_tokens: "ds4_tokens_in",
    input_tokens: "ds4_tokens_in",
    completion_tokens: "ds4_tokens_out",
    output_tokens: "ds4_tokens_out"
};
var USAGE = /"usage"\s*:\s*\{((?:[^{}]|\{[^{}]*\})*)\}/g;
var COUNT = /"(prompt_tokens|completion_tokens|input_tokens|output_tokens)"\s*:\s*(\d+)/g;
// Characters of one buffer kept for the next, so that a usage object cut between two buffers is read whole: vLLM's
// and llama-server's usage objects are under 400 characters.
var TAIL = 2048;
var tail = "";

function filter(r, data, flags) {
    r.sendBuffer(data, flags);
    if (r.uri.slice(-13) === "/count_tokens") {
        return;
    }
    var text = tail + data.toString();
    var u;
    var m;
    USAGE.lastIndex = 0;
    while ((u = USAGE.exec(text)) !== null) {
        COUNT.lastIndex = 0;
        while ((m = COUNT.exec(u[1])) !== null) {
            var name = FIELD[m[1]];
            var seen = r.variables[name];
            if (!seen || Number(m[2]) > Number(seen)) {
                r.variables[name] = m[2];
            }
        }
    }
    tail = text.slice(-TAIL);
}

export default {filter: filter};
