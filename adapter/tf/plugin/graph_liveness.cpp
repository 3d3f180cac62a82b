// Liveness classes of a graph's nodes (graph_liveness.h states the rules).
#include "adapter/tf/plugin/graph_liveness.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "adapter/tf/plugin/tensor_names.h"
#include "adapter/tf/plugin/tf_graph_headers.h"

namespace npusim::tf {
namespace {

namespace tfc = ::tensorflow;

using Atoms = std::set<std::string>;

bool is_op(const tfc::NodeDef& n, const char* op) {
  return n.op() == op || n.op() == std::string("Ref") + op;
}

// An atom is "<frame>:<text>": the frame it is defined in, then a predicate's literal
// ("<tensor>=1" / "<tensor>=0" for a Switch's boolean predicate, "<tensor>#<n>=<k>" for a
// _SwitchN's branch index with n outputs) or "@<node>" (a node's own, opaque atom). TensorFlow's
// node names hold neither '=' nor '#'.
int atom_frame(const std::string& atom) { return std::stoi(atom.substr(0, atom.find(':'))); }

// A literal's predicate (the atom up to its last '=') and value; an empty predicate for an own
// atom.
std::pair<std::string, std::string> literal(const std::string& atom) {
  const size_t eq = atom.rfind('=');
  if (eq == std::string::npos) return {"", ""};
  return {atom.substr(0, eq), atom.substr(eq + 1)};
}

// The number of values a literal's predicate takes: 2 for a Switch's, n for a _SwitchN's "#<n>".
int outcomes(const std::string& predicate) {
  const size_t hash = predicate.rfind('#');
  return hash == std::string::npos ? 2 : std::stoi(predicate.substr(hash + 1));
}

class Analysis {
 public:
  explicit Analysis(const tfc::GraphDef& graph) {
    for (const tfc::NodeDef& n : graph.node()) {
      m_index[n.name()] = static_cast<int>(m_nodes.size());
      m_nodes.push_back(&n);
    }
    m_inputs.resize(m_nodes.size());
    m_valid.assign(m_nodes.size(), 1);
    for (size_t v = 0; v < m_nodes.size(); ++v)
      for (const std::string& in : m_nodes[v]->input()) {
        const auto [src, port] = split_input(in);
        const auto it = m_index.find(src);
        if (it == m_index.end()) {
          m_valid[v] = 0;
          continue;
        }
        m_inputs[v].push_back({it->second, port});
      }
    m_frame.assign(m_nodes.size(), -1);
    m_atoms.resize(m_nodes.size());
    m_parent.push_back(-1);  // frame 0, the top frame
  }

  LivenessClasses run() {
    LivenessClasses out;
    out.of.assign(m_nodes.size(), "");
    out.frame.assign(m_nodes.size(), -1);
    out.atoms.assign(m_nodes.size(), {});
    const std::vector<int> order = forward_order();
    if (order.size() != m_nodes.size()) return out;  // cyclic without the NextIteration edges
    for (const int v : order) visit(v);
    for (size_t v = 0; v < m_nodes.size(); ++v) {
      if (!m_valid[v]) continue;
      out.frame[v] = m_frame[v];
      out.atoms[v].assign(m_atoms[v].begin(), m_atoms[v].end());
      if (is_control_flow_op(m_nodes[v]->op())) continue;
      std::string key = std::to_string(m_frame[v]) + "|";
      for (const std::string& a : m_atoms[v]) key += a + ",";
      out.of[v] = key;
    }
    return out;
  }

 private:
  bool back_edge(int src) const { return is_op(*m_nodes[src], "NextIteration"); }

  // A topological order of the graph without the edges out of NextIteration nodes.
  std::vector<int> forward_order() const {
    std::vector<std::vector<int>> succ(m_nodes.size());
    std::vector<int> indeg(m_nodes.size(), 0), order;
    for (size_t v = 0; v < m_nodes.size(); ++v)
      for (const auto& [src, port] : m_inputs[v])
        if (!back_edge(src)) {
          succ[src].push_back(static_cast<int>(v));
          ++indeg[v];
        }
    for (size_t v = 0; v < m_nodes.size(); ++v)
      if (indeg[v] == 0) order.push_back(static_cast<int>(v));
    for (size_t i = 0; i < order.size(); ++i)
      for (const int s : succ[order[i]])
        if (--indeg[s] == 0) order.push_back(s);
    return order;
  }

  int child_frame(int parent, const std::string& name) {
    const auto [it, added] = m_children.emplace(std::make_pair(parent, name), m_parent.size());
    if (added) m_parent.push_back(parent);
    return it->second;
  }

  // The atoms of input (src, port) as its reader sees them.
  Atoms input_atoms(int src, int port) const {
    Atoms a = m_atoms[src];
    const tfc::NodeDef& s = *m_nodes[src];
    if (is_op(s, "Switch") && (port == 0 || port == 1) && s.input_size() >= 2) {
      const auto [pred, pred_port] = split_input(s.input(1));
      a.insert(std::to_string(m_frame[src]) + ":" + pred + ":" + std::to_string(pred_port) +
               (port == 1 ? "=1" : "=0"));
    } else if (s.op() == "_SwitchN" && port >= 0 && s.input_size() >= 2) {
      // A lowered Case (tf.switch_case): output `port` is live iff the index selects it.
      const auto n = s.attr().find("num_outs");
      const auto [index, index_port] = split_input(s.input(1));
      if (n == s.attr().end() || port >= n->second.i()) return own_atom(src);
      a.insert(std::to_string(m_frame[src]) + ":" + index + ":" + std::to_string(index_port) + "#" +
               std::to_string(n->second.i()) + "=" + std::to_string(port));
    }
    return a;
  }

  Atoms own_atom(int v) const { return {std::to_string(m_frame[v]) + ":@" + m_nodes[v]->name()}; }

  void visit(int v) {
    const tfc::NodeDef& n = *m_nodes[v];
    for (const auto& [src, port] : m_inputs[v])
      if (!back_edge(src) && !m_valid[src]) m_valid[v] = 0;
    if (!m_valid[v]) return;
    // The frame.
    int frame = -1;
    for (const auto& [src, port] : m_inputs[v]) {
      if (back_edge(src)) continue;
      if (frame >= 0 && m_frame[src] != frame) {
        m_valid[v] = 0;
        return;
      }
      frame = m_frame[src];
    }
    if (frame < 0) frame = 0;  // no inputs (or only NextIteration ones): the top frame
    if (is_op(n, "Enter")) {
      const auto name = n.attr().find("frame_name");
      if (name == n.attr().end()) {
        m_valid[v] = 0;
        return;
      }
      frame = child_frame(frame, name->second.s());
    } else if (is_op(n, "Exit")) {
      frame = m_parent[static_cast<size_t>(frame)];
      if (frame < 0) {
        m_valid[v] = 0;
        return;
      }
    }
    m_frame[v] = frame;
    // The atoms.
    Atoms atoms;
    if (is_op(n, "Merge")) {
      atoms = merge_atoms(v);
    } else if (is_op(n, "Exit")) {
      atoms = exit_atoms(v);
    } else if (n.op() == "ControlTrigger") {
      atoms = own_atom(v);
    } else {
      for (const auto& [src, port] : m_inputs[v]) {
        const Atoms a = input_atoms(src, port);
        atoms.insert(a.begin(), a.end());
      }
    }
    m_atoms[v] = std::move(atoms);
  }

  Atoms merge_atoms(int v) const {
    std::vector<std::pair<int, int>> data, back;
    for (const auto& [src, port] : m_inputs[v]) {
      if (port < 0) return own_atom(v);  // a control input: not a plain cond or loop Merge
      (back_edge(src) ? back : data).push_back({src, port});
    }
    if (data.empty()) return own_atom(v);
    if (!back.empty()) {  // a loop's Merge: live in every iteration its Enter's frame runs
      if (back.size() == 1 && data.size() == 1 && is_op(*m_nodes[data[0].first], "Enter"))
        return input_atoms(data[0].first, data[0].second);
      return own_atom(v);
    }
    std::vector<Atoms> in;
    for (const auto& [src, port] : data) in.push_back(input_atoms(src, port));
    if (std::all_of(in.begin(), in.end(), [&](const Atoms& a) { return a == in[0]; })) return in[0];
    // The branches of one predicate: each input the common atoms and one literal of the
    // predicate, every value of the predicate once (a cond's two, a Case's n).
    Atoms common = in[0];
    for (const Atoms& a : in) {
      Atoms both;
      std::set_intersection(common.begin(), common.end(), a.begin(), a.end(),
                            std::inserter(both, both.end()));
      common = std::move(both);
    }
    std::string predicate;
    std::set<std::string> values;
    for (const Atoms& a : in) {
      Atoms rest;
      std::set_difference(a.begin(), a.end(), common.begin(), common.end(),
                          std::inserter(rest, rest.end()));
      if (rest.size() != 1) return own_atom(v);
      const auto [p, value] = literal(*rest.begin());
      if (p.empty() || (!predicate.empty() && p != predicate) || !values.insert(value).second)
        return own_atom(v);
      predicate = p;
    }
    const int n = outcomes(predicate);
    if (static_cast<int>(values.size()) != n) return own_atom(v);
    for (int k = 0; k < n; ++k)
      if (!values.count(std::to_string(k))) return own_atom(v);
    return common;
  }

  Atoms exit_atoms(int v) const {
    if (m_inputs[v].size() != 1 || m_inputs[v][0].second != 0) return own_atom(v);
    const int s = m_inputs[v][0].first;
    const tfc::NodeDef& sw = *m_nodes[s];
    if (!is_op(sw, "Switch") || sw.input_size() < 2) return own_atom(v);
    const auto pred = m_index.find(split_input(sw.input(1)).first);
    if (pred == m_index.end() || m_nodes[pred->second]->op() != "LoopCond") return own_atom(v);
    // The Switch's atoms must all belong to the exit's frame or an outer one.
    std::set<int> outer;
    for (int f = m_frame[v]; f >= 0; f = m_parent[static_cast<size_t>(f)]) outer.insert(f);
    for (const std::string& a : m_atoms[s])
      if (!outer.count(atom_frame(a))) return own_atom(v);
    return m_atoms[s];
  }

  std::vector<const tfc::NodeDef*> m_nodes;
  std::unordered_map<std::string, int> m_index;
  std::vector<std::vector<std::pair<int, int>>> m_inputs;  // (source node, port; -1 control)
  std::vector<char> m_valid;
  std::vector<int> m_frame;
  std::vector<Atoms> m_atoms;
  std::vector<int> m_parent;                              // frame -> its parent frame
  std::map<std::pair<int, std::string>, int> m_children;  // (parent, Enter's frame_name) -> frame
};

}  // namespace

LivenessClasses liveness_classes(const tfc::GraphDef& graph) { return Analysis(graph).run(); }

}  // namespace npusim::tf
