#pragma once
// MXNet's symbol files (`sym.save`, the `-symbol.json` of Gluon's export): a
// graph as nnvm writes it to JSON, read into and written from plain structs.
// What the ops and attrs mean is not this file's business.
//
// The layout MXNet 1.9.1 writes:
//   {"nodes": [{"op": "null" (a variable) or the op's name, "name": ...,
//               "attrs": {string: string} (only when non-empty),
//               "inputs": [[node, output index, version], ...]}, ...],
//    "arg_nodes": [the variables' node ids],
//    "node_row_ptr": [0, then the running total of the nodes' output counts],
//    "heads": [[node, output index, version], ...] (the graph's outputs),
//    "attrs": {"mxnet_version": ["int", 10901]}}
// Nodes are in topological order: a node reads only nodes before it. Older
// MXNet wrote "attr" or "param" instead of "attrs", left node_row_ptr out,
// and wrote entries as [node, index] pairs; all of that is read too.
#include <boost/json/parser.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "file.hpp"
#include "format_error.hpp"

namespace hybra::io {

// One output of a node: the `index`th output of node `node`.
struct SymbolEntry {
  std::int64_t node = 0;
  std::int64_t index = 0;
  // nnvm's count of the ops that updated a variable before this read: MXNet
  // writes 1 for BatchNorm's running mean and variance, which BatchNorm
  // itself updates, and 0 everywhere else. Kept so files round-trip exactly.
  std::int64_t version = 0;
  friend bool operator==(const SymbolEntry&, const SymbolEntry&) = default;
};

struct SymbolNode {
  std::string op;  // "null" for a variable (an input or a parameter)
  std::string name;
  std::vector<std::pair<std::string, std::string>> attrs;
  std::vector<SymbolEntry> inputs;
  // The node's outputs, counting hidden ones: BatchNorm has 3 (its output,
  // and the batch mean and variance). From node_row_ptr when the file has it,
  // else 1 + the highest output index read from the node (at least 1).
  std::int64_t outputs = 1;
  friend bool operator==(const SymbolNode&, const SymbolNode&) = default;
};

struct SymbolFile {
  std::vector<SymbolNode> nodes;
  std::vector<std::int64_t> arg_nodes;
  std::vector<SymbolEntry> heads;
  // 10901 is MXNet 1.9.1; a file without a version reads as 800 (0.8.0), as MXNet reads it.
  std::int64_t mxnet_version = 10901;
  friend bool operator==(const SymbolFile&, const SymbolFile&) = default;
};

// Beyond these a file is taken as corrupt rather than as a model.
inline constexpr std::size_t max_symbol_nodes = std::size_t{1} << 24;
inline constexpr std::int64_t max_symbol_node_outputs = std::int64_t{1} << 20;

namespace detail::symbol_json {

using boost::json::array;
using boost::json::object;
using boost::json::value;

inline std::string describe(std::size_t index, const SymbolNode& node) {
  return "node " + std::to_string(index) + " '" + node.name + "' (" + node.op + ")";
}

// The checks shared by parsing (FormatError) and encoding (ValueError):
// every reference in range and backwards, output indices within their node's
// outputs, arg_nodes naming variables. `reject(message)` throws.
template <class Reject>
void check(const SymbolFile& file, Reject&& reject) {
  const std::size_t n = file.nodes.size();
  if (n > max_symbol_nodes)
    reject("the graph has " + std::to_string(n) + " nodes, more than " + std::to_string(max_symbol_nodes));
  auto check_entry = [&](const SymbolEntry& e, std::size_t reader, const std::string& what) {
    if (e.node < 0 || static_cast<std::size_t>(e.node) >= n)
      reject(what + " reads node " + std::to_string(e.node) + ", but the graph has only " + std::to_string(n) +
             " nodes (a dangling reference)");
    const auto source = static_cast<std::size_t>(e.node);
    const SymbolNode& from = file.nodes[source];
    if (source == reader) reject(what + " reads the node's own output: a cycle");
    if (source > reader)
      reject(what + " reads " + describe(source, from) +
             ", which comes later: a cycle (MXNet stores nodes in topological order)");
    if (e.index < 0 || e.index >= from.outputs)
      reject(what + " reads output " + std::to_string(e.index) + " of " + describe(source, from) + ", which has " +
             std::to_string(from.outputs) + " output" + (from.outputs == 1 ? "" : "s"));
    if (e.version < 0 || e.version > std::numeric_limits<std::uint32_t>::max())
      reject(what + " has version " + std::to_string(e.version) + ", outside MXNet's 0 to 4294967295");
  };
  for (std::size_t i = 0; i < n; ++i) {
    const SymbolNode& node = file.nodes[i];
    const std::string label = describe(i, node);
    if (node.op.empty()) reject(label + ": the op is empty");
    if (node.outputs < 1 || node.outputs > max_symbol_node_outputs)
      reject(label + ": " + std::to_string(node.outputs) + " outputs is out of range (1 to " +
             std::to_string(max_symbol_node_outputs) + ")");
    if (node.op == "null" && node.outputs != 1)
      reject(label + ": a variable has 1 output, not " + std::to_string(node.outputs));
    if (node.op == "null" && !node.inputs.empty()) reject(label + ": a variable (op \"null\") has inputs");
    std::unordered_set<std::string_view> keys;
    for (const auto& [key, text] : node.attrs)
      if (!keys.insert(key).second) reject(label + ": attr '" + key + "' appears twice");
    for (std::size_t k = 0; k < node.inputs.size(); ++k)
      check_entry(node.inputs[k], i, label + ": input " + std::to_string(k));
  }
  std::vector<bool> is_arg(n, false);
  for (std::size_t k = 0; k < file.arg_nodes.size(); ++k) {
    const std::int64_t id = file.arg_nodes[k];
    const std::string what = "arg_nodes[" + std::to_string(k) + "]";
    if (id < 0 || static_cast<std::size_t>(id) >= n)
      reject(what + " is node " + std::to_string(id) + ", but the graph has only " + std::to_string(n) + " nodes");
    const auto at = static_cast<std::size_t>(id);
    if (file.nodes[at].op != "null")
      reject(what + " is " + describe(at, file.nodes[at]) + ", which is not a variable (op \"null\")");
    if (is_arg[at]) reject(what + " lists " + describe(at, file.nodes[at]) + " a second time");
    is_arg[at] = true;
  }
  if (file.heads.empty()) reject("the graph has no heads (outputs)");
  for (std::size_t k = 0; k < file.heads.size(); ++k) check_entry(file.heads[k], n, "head " + std::to_string(k));
}

// Reading the JSON value tree, with errors naming the file and where in the
// graph the bad value is.
class Reader {
 public:
  explicit Reader(std::string_view file) : file_(file) {}

  [[noreturn]] void reject(const std::string& message) const {
    fail<FormatError>("model file '", file_, "': ", message);
  }

  static std::string_view kind(const value& v) {
    switch (v.kind()) {
      case boost::json::kind::object: return "an object";
      case boost::json::kind::array: return "an array";
      case boost::json::kind::string: return "a string";
      case boost::json::kind::bool_: return "a boolean";
      case boost::json::kind::null: return "null";
      default: return "a number";
    }
  }

  // MXNet's reader rejects keys it does not know, and so does this one: a
  // misspelt "attrs" would otherwise silently drop a node's attrs.
  void only_known_keys(const object& o, std::initializer_list<std::string_view> known, const std::string& where) const {
    for (const auto& kv : o)
      if (std::find(known.begin(), known.end(), kv.key()) == known.end())
        reject(where + " has an unknown key \"" + std::string(kv.key()) + "\"");
  }

  const value& field(const object& o, std::string_view key, const std::string& where) const {
    const value* v = o.if_contains(key);
    if (!v) reject(where + " has no \"" + std::string(key) + "\"");
    return *v;
  }
  const array& as_array(const value& v, const std::string& what) const {
    if (!v.is_array()) reject(what + " is " + std::string(kind(v)) + ", not an array");
    return v.get_array();
  }
  const object& as_object(const value& v, const std::string& what) const {
    if (!v.is_object()) reject(what + " is " + std::string(kind(v)) + ", not an object");
    return v.get_object();
  }
  std::string as_string(const value& v, const std::string& what) const {
    if (!v.is_string()) reject(what + " is " + std::string(kind(v)) + ", not a string");
    return std::string(v.get_string());
  }
  std::int64_t as_count(const value& v, const std::string& what) const {
    if (v.is_int64() && v.get_int64() >= 0) return v.get_int64();
    if (v.is_uint64()) reject(what + " is " + boost::json::serialize(v) + ", too large");
    const bool number = v.is_int64() || v.is_double();
    reject(what + " is " + (number ? boost::json::serialize(v) : std::string(kind(v))) + ", not a non-negative integer");
  }

  // [node, index] or [node, index, version].
  SymbolEntry entry(const value& v, const std::string& what) const {
    const array& parts = as_array(v, what);
    if (parts.size() != 2 && parts.size() != 3)
      reject(what + " has " + std::to_string(parts.size()) + " numbers, not [node, index] or [node, index, version]");
    SymbolEntry e;
    e.node = as_count(parts[0], what + "'s node");
    e.index = as_count(parts[1], what + "'s output index");
    if (parts.size() == 3) e.version = as_count(parts[2], what + "'s version");
    return e;
  }

  SymbolNode node(const value& v, std::size_t index) const {
    const std::string where = "node " + std::to_string(index);
    const object& o = as_object(v, where);
    SymbolNode node;
    node.op = as_string(field(o, "op", where), where + "'s \"op\"");
    node.name = as_string(field(o, "name", where), where + "'s \"name\"");
    const std::string label = describe(index, node);
    only_known_keys(
        o, {"op", "name", "attrs", "attr", "param", "inputs", "control_deps", "subgraphs", "backward_source_id"}, label);
    // "attr" and "param" are older MXNet's names for "attrs"; a key in more
    // than one keeps its first value, as MXNet's loader does.
    std::unordered_set<std::string_view> seen;
    for (std::string_view key : {"attrs", "attr", "param"}) {
      const value* attrs = o.if_contains(key);
      if (!attrs) continue;
      for (const auto& kv : as_object(*attrs, label + "'s \"" + std::string(key) + "\"")) {
        std::string text = as_string(kv.value(), label + ": attr '" + std::string(kv.key()) + "'");
        if (seen.insert(kv.key()).second) node.attrs.emplace_back(kv.key(), std::move(text));
      }
    }
    const array& inputs = as_array(field(o, "inputs", label), label + "'s \"inputs\"");
    for (std::size_t k = 0; k < inputs.size(); ++k)
      node.inputs.push_back(entry(inputs[k], label + ": input " + std::to_string(k)));
    // Control dependencies only order side effects, which a model file's
    // ops do not have, and backward_source_id is a training-time leftover of
    // MXNet 0.8; subgraphs carry the bodies of control-flow ops.
    const value* subgraphs = o.if_contains("subgraphs");
    if (subgraphs && !(subgraphs->is_array() && subgraphs->get_array().empty()))
      reject(label + " has subgraphs (a control-flow op such as _foreach or _cond), which hybra does not support");
    return node;
  }

 private:
  std::string_view file_;
};

// Writes JSON in the layout of MXNet's writer (dmlc::JSONWriter), so a file
// hybra writes is byte for byte the file MXNet writes for the same graph: a
// multi-line scope puts each item on its own line indented by two spaces per
// open scope, after ", " (trailing space included); a single-line scope
// separates items by ", ". Arrays of more than 10 numbers or entries are
// multi-line, attr maps of more than one key too; nodes always are.
class Writer {
 public:
  std::string out;

  void begin(char bracket, bool multi_line) {
    out += bracket;
    scopes_.push_back({multi_line, 0});
  }
  void end(char bracket) {
    const Scope closed = scopes_.back();
    scopes_.pop_back();
    if (closed.multi_line && closed.items) separator();
    out += bracket;
  }
  void item() {
    if (scopes_.back().items++) out += ", ";
    separator();
  }
  void key(std::string_view k, std::string_view where = "a key") {
    item();
    string(k, where);
    out += ": ";
  }
  // MXNet's reader understands only the escapes \" \\ \n \r \t, so other
  // control characters cannot be written in a way it reads back.
  void string(std::string_view s, std::string_view where) {
    out += '"';
    for (char c : s) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20)
            fail<ValueError>("encode_symbol_json: ", where, " contains the control character ",
                             static_cast<int>(c), ", which MXNet cannot read");
          out += c;
      }
    }
    out += '"';
  }
  void integer(std::int64_t v) { out += std::to_string(v); }
  void integers(const std::vector<std::int64_t>& values) {
    begin('[', values.size() > 10);
    for (auto v : values) {
      item();
      integer(v);
    }
    end(']');
  }
  void entries(const std::vector<SymbolEntry>& list) {
    begin('[', list.size() > 10);
    for (const auto& e : list) {
      item();
      begin('[', false);
      for (auto v : {e.node, e.index, e.version}) {
        item();
        integer(v);
      }
      end(']');
    }
    end(']');
  }

 private:
  struct Scope {
    bool multi_line;
    std::size_t items;
  };
  void separator() {
    if (scopes_.empty() || scopes_.back().multi_line) {
      out += '\n';
      out.append(2 * scopes_.size(), ' ');
    }
  }
  std::vector<Scope> scopes_;
};

}  // namespace detail::symbol_json

// The text of a symbol file, exactly as MXNet 1.9.1 writes it (attrs sorted
// by key, as MXNet sorts them). `node_row_ptr` is derived from the nodes'
// `outputs`. A graph MXNet could not load (references out of range or
// forwards, output indices beyond a node's outputs, arg_nodes that are not
// variables, no heads, control characters in names) is a ValueError.
inline std::string encode_symbol_json(const SymbolFile& file) {
  namespace sj = detail::symbol_json;
  sj::check(file, [](const std::string& message) { fail<ValueError>("encode_symbol_json: ", message); });
  sj::Writer w;
  w.begin('{', true);
  w.key("nodes");
  w.begin('[', true);
  for (std::size_t i = 0; i < file.nodes.size(); ++i) {
    const SymbolNode& node = file.nodes[i];
    const std::string label = sj::describe(i, node);
    w.item();
    w.begin('{', true);
    w.key("op");
    w.string(node.op, label + "'s op");
    w.key("name");
    w.string(node.name, label + "'s name");
    if (!node.attrs.empty()) {
      auto attrs = node.attrs;
      std::sort(attrs.begin(), attrs.end());
      w.key("attrs");
      w.begin('{', attrs.size() > 1);
      for (const auto& [key, text] : attrs) {
        w.key(key, label + "'s attr name '" + key + "'");
        w.string(text, label + "'s attr '" + key + "'");
      }
      w.end('}');
    }
    w.key("inputs");
    w.entries(node.inputs);
    w.end('}');
  }
  w.end(']');
  w.key("arg_nodes");
  w.integers(file.arg_nodes);
  std::vector<std::int64_t> row_ptr{0};
  for (const auto& node : file.nodes) row_ptr.push_back(row_ptr.back() + node.outputs);
  w.key("node_row_ptr");
  w.integers(row_ptr);
  w.key("heads");
  w.entries(file.heads);
  w.key("attrs");
  w.begin('{', false);
  w.key("mxnet_version");
  w.begin('[', false);
  w.item();
  w.string("int", "the version");
  w.item();
  w.integer(file.mxnet_version);
  w.end(']');
  w.end('}');
  w.end('}');
  return std::move(w.out);
}

// The graph of a symbol file, checked. Text that is not JSON is a
// FormatError naming `file_name` and the byte offset where parsing stopped;
// a graph that is not a valid MXNet graph (missing, unknown or ill-typed keys,
// references out of range or forwards, output indices beyond a node's
// outputs, arg_nodes that are not variables, unsupported subgraphs) is a
// FormatError naming the file and the node.
inline SymbolFile parse_symbol_json(std::string_view text, std::string_view file_name) {
  namespace sj = detail::symbol_json;
  boost::json::parse_options options;
  // The format nests 5 deep; the limit keeps hostile nesting from costing stack.
  options.max_depth = 20;
  // MXNet writes names' bytes as they are, UTF-8 or not.
  options.allow_invalid_utf8 = true;
  boost::json::parser parser({}, options);
  boost::system::error_code ec;
  const std::size_t used = parser.write_some(text.data(), text.size(), ec);
  if (ec) fail_at_offset(file_name, used, "not valid JSON: ", ec.message());
  if (const auto rest = text.find_first_not_of(" \t\r\n", used); rest != std::string_view::npos)
    fail_at_offset(file_name, rest, "unexpected text after the JSON value");
  const boost::json::value root = parser.release();

  const sj::Reader in(file_name);
  const auto& top = in.as_object(root, "the top level");
  in.only_known_keys(top, {"nodes", "arg_nodes", "node_row_ptr", "heads", "attrs"}, "the top level");
  SymbolFile file;
  const auto& nodes = in.as_array(in.field(top, "nodes", "the top level"), "\"nodes\"");
  if (nodes.size() > max_symbol_nodes)
    in.reject("the graph has " + std::to_string(nodes.size()) + " nodes, more than " + std::to_string(max_symbol_nodes));
  file.nodes.reserve(nodes.size());
  for (std::size_t i = 0; i < nodes.size(); ++i) file.nodes.push_back(in.node(nodes[i], i));

  for (const auto& id : in.as_array(in.field(top, "arg_nodes", "the top level"), "\"arg_nodes\""))
    file.arg_nodes.push_back(in.as_count(id, "arg_nodes[" + std::to_string(file.arg_nodes.size()) + "]"));
  for (const auto& head : in.as_array(in.field(top, "heads", "the top level"), "\"heads\""))
    file.heads.push_back(in.entry(head, "head " + std::to_string(file.heads.size())));

  if (const auto* row_ptr_value = top.if_contains("node_row_ptr")) {
    const auto& row_ptr = in.as_array(*row_ptr_value, "\"node_row_ptr\"");
    if (row_ptr.size() != nodes.size() + 1)
      in.reject("\"node_row_ptr\" has " + std::to_string(row_ptr.size()) + " numbers for " +
                std::to_string(nodes.size()) + " nodes (it needs one more than the nodes)");
    std::int64_t previous = in.as_count(row_ptr[0], "node_row_ptr[0]");
    if (previous != 0) in.reject("node_row_ptr[0] is " + std::to_string(previous) + ", not 0");
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      const std::int64_t next = in.as_count(row_ptr[i + 1], "node_row_ptr[" + std::to_string(i + 1) + "]");
      if (next <= previous)
        in.reject("node_row_ptr[" + std::to_string(i + 1) + "] is " + std::to_string(next) + ", not above " +
                  std::to_string(previous) + ": " + sj::describe(i, file.nodes[i]) + " would have no outputs");
      file.nodes[i].outputs = next - previous;
      previous = next;
    }
  } else {
    // Without node_row_ptr only the op knows its outputs; the caller who
    // knows the op may correct these counts.
    // Indices beyond any op's outputs are left for check() to report.
    auto note = [&](const SymbolEntry& e) {
      if (e.node < 0 || static_cast<std::size_t>(e.node) >= file.nodes.size()) return;
      auto& node = file.nodes[static_cast<std::size_t>(e.node)];
      if (node.op != "null" && e.index < max_symbol_node_outputs) node.outputs = std::max(node.outputs, e.index + 1);
    };
    for (const auto& node : file.nodes)
      for (const auto& e : node.inputs) note(e);
    for (const auto& e : file.heads) note(e);
  }

  file.mxnet_version = 800;
  if (const auto* attrs = top.if_contains("attrs")) {
    if (const auto* version = in.as_object(*attrs, "the top level's \"attrs\"").if_contains("mxnet_version")) {
      const std::string what = "\"mxnet_version\"";
      if (!version->is_array() || version->get_array().size() != 2 || !version->get_array()[0].is_string() ||
          version->get_array()[0].get_string() != "int")
        in.reject(what + " is not [\"int\", version]");
      file.mxnet_version = in.as_count(version->get_array()[1], what);
    }
  }
  sj::check(file, [&](const std::string& message) { in.reject(message); });
  return file;
}

inline SymbolFile load_symbol_json(const std::filesystem::path& path) {
  return parse_symbol_json(read_file(path), path.string());
}

// Writes encode_symbol_json(file) to `path` atomically (file.hpp).
inline void save_symbol_json(const std::filesystem::path& path, const SymbolFile& file) {
  write_file_atomically(path, encode_symbol_json(file));
}

}  // namespace hybra::io
