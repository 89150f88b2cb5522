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
// generated text every quote is escaped (RFC 8259, section 7), so the pattern cannot match there. In a stream the
// counts only grow (a later usage is cumulative), so the largest seen is the answer's; in a whole answer the last
// usage object is the answer's own (OpenAI and Anthropic put it after the content).
// /v1/messages/count_tokens counts a prompt that is not served: its answer is not counted.
//
// Memory: njs frees nothing before the request ends, so a buffer is turned into text only when it holds, or
// continues, a "usage" object; between those only the last few bytes are kept. An error in here must never cut the
// answer: the buffer is passed on first, and the counting is wrapped.
//
// njs 0.7.9 (Debian bookworm's libnginx-mod-http-js; js_body_filter and js_var in
// https://nginx.org/en/docs/http/ngx_http_js_module.html): each request runs in its own clone of the module's VM,
// so `held` and `edge` belong to one answer.

var FIELD = {
    prompt_tokens: "ds4_tokens_in",
    input_tokens: "ds4_tokens_in",
    completion_tokens: "ds4_tokens_out",
    output_tokens: "ds4_tokens_out"
};
var KEY = '"usage"';
var USAGE = /"usage"\s*:\s*\{((?:[^{}]|\{[^{}]*\})*)\}/g;
var COUNT = /"(prompt_tokens|completion_tokens|input_tokens|output_tokens)"\s*:\s*(\d+)/g;
// The most text of an unclosed usage object carried to the next buffer: vLLM's and llama-server's usage objects are
// under 400 characters; anything longer is not one.
var HOLD = 4096;
var held = "";  // text from an unclosed "usage" on
var edge = "";  // the last bytes of the previous buffer, for a "usage" cut between two buffers

// Sets the counts of every complete usage object in `body`; returns where the last one ends (0: none).
function count(r, body, stream) {
    var u;
    var m;
    var end = 0;
    USAGE.lastIndex = 0;
    while ((u = USAGE.exec(body)) !== null) {
        end = USAGE.lastIndex;
        COUNT.lastIndex = 0;
        while ((m = COUNT.exec(u[1])) !== null) {
            var name = FIELD[m[1]];
            var seen = r.variables[name];
            if (!stream || !seen || Number(m[2]) > Number(seen)) {
                r.variables[name] = m[2];
            }
        }
    }
    return end;
}

function filter(r, data, flags) {
    r.sendBuffer(data, flags);
    try {
        if (r.uri.slice(-13) === "/count_tokens") {
            return;
        }
        if (!held && data.indexOf(KEY) < 0 && (edge + data.slice(0, KEY.length).toString()).indexOf(KEY) < 0) {
            edge = (edge + data.slice(-(KEY.length - 1)).toString()).slice(-(KEY.length - 1));
            return;
        }
        var text = (held || edge) + data.toString();
        var stream = String(r.headersOut["Content-Type"] || "").indexOf("text/event-stream") === 0;
        // Carry an unclosed usage object (one that starts after the last complete one) to the next buffer.
        var open = text.indexOf(KEY, count(r, text, stream));
        held = open >= 0 && text.length - open <= HOLD ? text.slice(open) : "";
        edge = held ? "" : text.slice(-(KEY.length - 1));
    } catch (e) {
        held = "";
        edge = "";
    }
}

export default {filter: filter};
