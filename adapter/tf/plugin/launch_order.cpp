// Chaining each NPU's nodes in a canonical launch order (launch_order.h).
#include "adapter/tf/plugin/launch_order.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <queue>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "adapter/tf/plugin/graph_liveness.h"
#include "adapter/tf/plugin/tensor_names.h"
#include "adapter/tf/plugin/tf_graph_headers.h"

namespace npusim::tf {
namespace {

namespace tfc = ::tensorflow;

bool on_npu(const tfc::NodeDef& n) { return on_npu_device(n.device()); }

// Ops that complete after their kernel returns: a replica's collective part waits for the other
// replicas (kernels_collective.cpp). They stay out of the chain and count as the boundaries of
// the order's levels.
bool is_async(const tfc::NodeDef& n) { return n.op() == "NpuCollective"; }

// Nodes that run work on their NPU and join its chain (launch_order.h, "Chained").
bool chained(const tfc::NodeDef& n) {
  // clang-format off
  static const std::set<std::string> kPlumbing = {
      "_Arg", "_Retval", "_DeviceArg", "_DeviceRetval", "_Send", "_Recv", "_HostSend",
      "_HostRecv", "NoOp", "Const", "HostConst", "Placeholder", "PlaceholderWithDefault",
      "PartitionedCall", "StatefulPartitionedCall", "If", "StatelessIf", "While",
      "StatelessWhile", "Case", "StatelessCase"};
  // clang-format on
  return on_npu(n) && !is_async(n) && !kPlumbing.count(n.op());
}

// A device's name as a part of a node's name: its letters and digits, '_' for the rest.
std::string device_suffix(const std::string& device) {
  std::string suffix;
  for (char ch : device) suffix += (std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_');
  return suffix;
}

// The input gate's name for an NPU device: "npusim_order_inputs" and the device's name.
std::string gate_name(const std::string& device) {
  return "npusim_order_inputs" + device_suffix(device);
}

bool is_gate(const tfc::NodeDef& n) { return n.attr().count(kInputGateAttr) > 0; }
bool is_copy_gate(const tfc::NodeDef& n) {
  return n.attr().count(kCopyGateAttr) > 0 || n.attr().count(kReadBackGateAttr) > 0;
}
bool is_join(const tfc::NodeDef& n) { return n.attr().count(kJoinAttr) > 0; }
// The nodes the chain adds, which come off with it.
bool is_any_gate(const tfc::NodeDef& n) { return is_gate(n) || is_copy_gate(n) || is_join(n); }

// The memory types of a node's inputs and outputs on an NPU (false: unknown op or no kernel).
bool npu_memory_types(const tfc::NodeDef& node, tfc::MemoryTypeVector* in_mem,
                      tfc::MemoryTypeVector* out_mem) {
  // MemoryTypesForNode wants every attribute, defaults included.
  const tfc::OpDef* op_def = nullptr;
  if (!tfc::OpRegistry::Global()->LookUpOpDef(node.op(), &op_def).ok()) return false;
  tfc::NodeDef full = node;
  tfc::AddDefaultsToNodeDef(*op_def, &full);
  return tfc::MemoryTypesForNode(tfc::OpRegistry::Global(), tfc::DeviceType("NPU"), full, in_mem,
                                 out_mem)
      .ok();
}

// Whether `producer`'s output `port`, read in device memory by `reader` (a chained node), reaches
// the reader through a host-to-device copy that TensorFlow adds after this pass and that no
// chained node orders (launch_order.h, "Input gate"): a function argument on another device, or
// the host-memory output of a node without inputs on the reader's device (an int32 Const there
// is a HostConst; its receive copies it onto the device every step).
bool copied_in_unordered(const tfc::NodeDef& producer, int port, const tfc::NodeDef& reader) {
  const auto type = producer.attr().find(producer.op() == "_Arg" ? "T" : "dtype");
  if (type == producer.attr().end() || tfc::DataTypeAlwaysOnHost(type->second.type())) return false;
  if (producer.op() == "_Arg") return producer.device() != reader.device();
  if (producer.op() != "Const" || producer.input_size() > 0 || producer.device() != reader.device())
    return false;
  tfc::MemoryTypeVector in_mem, out_mem;
  return npu_memory_types(producer, &in_mem, &out_mem) && port < static_cast<int>(out_mem.size()) &&
         out_mem[static_cast<size_t>(port)] == tfc::HOST_MEMORY;
}

// The tensors a gate reads, in order of first reading, their types, and whether it reads each in
// host memory (as a reader that has it copied to the host does) rather than device memory.
struct GateReads {
  std::vector<std::string> tensors;
  std::vector<tfc::DataType> types;
  std::vector<bool> in_host_memory;
  void add(const std::string& tensor, tfc::DataType type, bool host_memory = false) {
    for (size_t i = 0; i < tensors.size(); ++i)
      if (tensors[i] == tensor && in_host_memory[i] == host_memory) return;
    tensors.push_back(tensor);
    types.push_back(type);
    in_host_memory.push_back(host_memory);
  }
};

// Calls read(reader, input as written, producer's index, port) for each data input that a node
// of `graph` reads from a node of `graph` in memory `memory`, where the reader is a chained node
// or, with `control_flow_readers`, also a control-flow op on an NPU (a Switch's predicate).
template <typename Read>
void for_each_npu_read(const tfc::GraphDef& graph,
                       const std::unordered_map<std::string, int>& index, tfc::MemoryType memory,
                       bool control_flow_readers, Read read) {
  for (const tfc::NodeDef& node : graph.node()) {
    if (!chained(node) && !(control_flow_readers && on_npu(node) && is_control_flow_op(node.op())))
      continue;
    tfc::MemoryTypeVector in_mem, out_mem;
    if (!npu_memory_types(node, &in_mem, &out_mem)) continue;
    for (int i = 0; i < node.input_size() && i < static_cast<int>(in_mem.size()); ++i) {
      const auto [name, port] = split_input(node.input(i));
      const auto it = index.find(name);
      if (port < 0 || it == index.end() || in_mem[static_cast<size_t>(i)] != memory) continue;
      read(node, node.input(i), it->second, port);
    }
  }
}

// The memory types of the outputs of the nodes of `graph` on an NPU, looked up once per node.
class OutputMemory {
 public:
  explicit OutputMemory(const tfc::GraphDef& graph) : m_graph(graph) {}
  bool is(int v, int port, tfc::MemoryType memory) {
    auto it = m_types.find(v);
    if (it == m_types.end()) {
      tfc::MemoryTypeVector in_mem, out_mem;
      if (!npu_memory_types(m_graph.node(v), &in_mem, &out_mem)) out_mem.clear();
      it = m_types.emplace(v, std::move(out_mem)).first;
    }
    return port < static_cast<int>(it->second.size()) &&
           it->second[static_cast<size_t>(port)] == memory;
  }

 private:
  const tfc::GraphDef& m_graph;
  std::map<int, tfc::MemoryTypeVector> m_types;
};

// The type of output `port` of `node`, false if unknown.
bool output_type(const tfc::NodeDef& node, int port, tfc::DataType* type) {
  const tfc::OpDef* op_def = nullptr;
  return tfc::OpRegistry::Global()->LookUpOpDef(node.op(), &op_def).ok() &&
         tfc::OutputTypeForNode(node, *op_def, port, type).ok();
}

// The index of gate `name`: the node of that name if `graph` has one (a chain kept), else a new
// IdentityN on `device` reading `reads`, marked with the boolean attribute `marker`.
int add_gate(tfc::GraphDef& graph, const std::unordered_map<std::string, int>& index,
             const std::string& name, const std::string& device, const GateReads& reads,
             const char* marker) {
  if (const auto it = index.find(name); it != index.end()) return it->second;
  tfc::NodeDef& gate = *graph.add_node();
  gate.set_name(name);
  gate.set_op("IdentityN");
  gate.set_device(device);
  for (const std::string& t : reads.tensors) gate.add_input(t);
  auto& attrs = *gate.mutable_attr();
  for (tfc::DataType t : reads.types) attrs["T"].mutable_list()->add_type(t);
  // Inputs read in host memory (TensorFlow's memory types honour these attributes; a TensorFlow
  // that did not would read them in device memory, copying nothing, and the gate would order
  // no copy).
  for (size_t i = 0; i < reads.tensors.size(); ++i)
    if (reads.in_host_memory[i]) {
      attrs["_input_hostmem"].mutable_list()->add_i(static_cast<int64_t>(i));
      attrs["_output_hostmem"].mutable_list()->add_i(static_cast<int64_t>(i));
    }
  attrs[marker].set_b(true);
  return graph.node_size() - 1;
}

// Adds, for each NPU device whose chained nodes read, in device memory, a tensor that is copied
// onto the device with nothing ordering the copy (copied_in_unordered: a function argument on
// another device, a HostConst of the device), one IdentityN on that device reading all those
// tensors: its inputs share the receives TensorFlow's partitioning gives the readers, so it runs
// once every such tensor was copied onto the device (launch_order.h, "Input gate"). Returns the
// gates' indices in `graph`; a device that already has its gate (a chain kept) keeps it.
std::vector<int> add_input_gates(tfc::GraphDef& graph) {
  std::unordered_map<std::string, int> index;
  for (int v = 0; v < graph.node_size(); ++v) index[graph.node(v).name()] = v;
  std::map<std::string, GateReads> reads;  // device -> the tensors its gate reads
  for_each_npu_read(
      graph, index, tfc::DEVICE_MEMORY, false,
      [&](const tfc::NodeDef& node, const std::string& in, int producer_index, int port) {
        const tfc::NodeDef& producer = graph.node(producer_index);
        if (!copied_in_unordered(producer, port, node)) return;
        reads[node.device()].add(
            in, producer.attr().at(producer.op() == "_Arg" ? "T" : "dtype").type());
      });
  // Arguments in the device's memory that a node of the device reads in host memory (a cond's
  // predicate read by its Switches): each is copied to the host when an executor thread gets to
  // its receive. The gate reads them in host memory too, sharing those copies.
  OutputMemory outputs(graph);
  for_each_npu_read(
      graph, index, tfc::HOST_MEMORY, true,
      [&](const tfc::NodeDef& node, const std::string& in, int producer_index, int port) {
        const tfc::NodeDef& producer = graph.node(producer_index);
        const auto type = producer.attr().find("T");
        if (producer.op() != "_Arg" || producer.device() != node.device() ||
            type == producer.attr().end() || tfc::DataTypeAlwaysOnHost(type->second.type()) ||
            !outputs.is(producer_index, port, tfc::DEVICE_MEMORY))
          return;
        reads[node.device()].add(in, type->second.type(), true);
      });
  std::vector<int> gates;
  for (const auto& [device, read] : reads)
    gates.push_back(add_gate(graph, index, gate_name(device), device, read, kInputGateAttr));
  return gates;
}

// Adds, for each chained node with an output in host memory that a chained node on its device
// reads in device memory (TensorFlow copies it onto the device after the node ran, with nothing
// ordering the copy), one IdentityN on that device reading those outputs: it shares the readers'
// copies, so it runs once they are done (launch_order.h, "Copy gates"). Returns (gate, the node
// it follows) pairs of indices in `graph`; a node that already has its gate (a chain kept) keeps
// it.
std::vector<std::pair<int, int>> add_copy_gates(tfc::GraphDef& graph) {
  std::unordered_map<std::string, int> index;
  for (int v = 0; v < graph.node_size(); ++v) index[graph.node(v).name()] = v;
  OutputMemory outputs(graph);
  std::map<int, GateReads> reads;  // producer -> its outputs read so
  for_each_npu_read(
      graph, index, tfc::DEVICE_MEMORY, false,
      [&](const tfc::NodeDef& node, const std::string& in, int producer_index, int port) {
        const tfc::NodeDef& producer = graph.node(producer_index);
        tfc::DataType type;
        if (is_control_flow_op(node.op()) || !chained(producer) ||
            is_control_flow_op(producer.op()) || producer.device() != node.device() ||
            !outputs.is(producer_index, port, tfc::HOST_MEMORY) ||
            !output_type(producer, port, &type) || tfc::DataTypeAlwaysOnHost(type))
          return;
        reads[producer_index].add(in, type);
      });
  std::vector<std::pair<int, int>> gates;
  for (const auto& [producer, read] : reads) {
    const tfc::NodeDef& node = graph.node(producer);
    gates.emplace_back(add_gate(graph, index, node.name() + "/npusim_order_copies", node.device(),
                                read, kCopyGateAttr),
                       producer);
  }
  return gates;
}

// Adds, for each chained node with an output in device memory that a node on its device reads in
// host memory (a list op's index or element shape, a Switch's predicate: TensorFlow's memory-type
// pass adds a send and a host receive after this pass, and the receive copies the output to the
// host when an executor thread gets to it), one IdentityN on that device reading those outputs in
// host memory (`_input_hostmem`): it shares the readers' receive (one per output), so it runs
// once the copies are done (launch_order.h, "Read-back gates"). Returns (gate, the node it
// follows) pairs of indices in `graph`; a node that already has its gate (a chain kept) keeps it.
std::vector<std::pair<int, int>> add_read_back_gates(tfc::GraphDef& graph) {
  std::unordered_map<std::string, int> index;
  for (int v = 0; v < graph.node_size(); ++v) index[graph.node(v).name()] = v;
  OutputMemory outputs(graph);
  std::map<int, GateReads> reads;  // producer -> its outputs read so
  for_each_npu_read(
      graph, index, tfc::HOST_MEMORY, true,
      [&](const tfc::NodeDef& node, const std::string& in, int producer_index, int port) {
        const tfc::NodeDef& producer = graph.node(producer_index);
        tfc::DataType type;
        if (!chained(producer) || is_control_flow_op(producer.op()) || is_any_gate(producer) ||
            producer.device() != node.device() ||
            !outputs.is(producer_index, port, tfc::DEVICE_MEMORY) ||
            !output_type(producer, port, &type) || tfc::DataTypeAlwaysOnHost(type))
          return;
        reads[producer_index].add(in, type, true);
      });
  std::vector<std::pair<int, int>> gates;
  for (const auto& [producer, read] : reads) {
    const tfc::NodeDef& node = graph.node(producer);
    gates.emplace_back(add_gate(graph, index, node.name() + "/npusim_order_read_back",
                                node.device(), read, kReadBackGateAttr),
                       producer);
  }
  return gates;
}

// The nodes a NoOp `name` waits for (its inputs, through NoOps among them); none for another
// op. TensorFlow's dependency optimizer bypasses such NoOps, handing their inputs on to their
// readers as control edges (GroupCrossDeviceControlEdges_* of a MirroredStrategy step).
std::vector<std::string> noop_sources(const tfc::GraphDef& graph,
                                      const std::unordered_map<std::string, int>& index,
                                      const std::string& name) {
  std::vector<std::string> sources, todo = {name};
  std::set<std::string> seen = {name};
  while (!todo.empty()) {
    const std::string n = todo.back();
    todo.pop_back();
    const auto it = index.find(n);
    if (it == index.end()) continue;
    const tfc::NodeDef& node = graph.node(it->second);
    if (node.op() != "NoOp") {
      if (n != name) sources.push_back(n);
      continue;
    }
    for (const std::string& in : node.input()) {
      const std::string source = split_input(in).first;
      if (seen.insert(source).second) todo.push_back(source);
    }
  }
  std::sort(sources.begin(), sources.end());
  return sources;
}

bool is_op(const tfc::NodeDef& n, const char* op) {
  return n.op() == op || n.op() == std::string("Ref") + op;
}

// The frame of node v's first input (an Enter's: the frame the loop is entered from); -1 for a
// node without inputs or whose first input is not classified.
int first_input_frame(const tfc::GraphDef& graph, const std::unordered_map<std::string, int>& index,
                      const LivenessClasses& live, int v) {
  if (graph.node(v).input_size() == 0) return -1;
  const auto it = index.find(split_input(graph.node(v).input(0)).first);
  return it == index.end() ? -1 : live.frame[static_cast<size_t>(it->second)];
}

// The chain of a graph with control flow (launch_order.h, "Control flow"), each NPU's nodes in
// each frame: `order` is a topological order of the graph without the edges out of
// NextIteration, each loop's Enters before its Exits (indices >= the graph's size: the frames'
// own nodes). Each target (a chained node of device d, or an Enter: once per device that has
// chained nodes in its loop) gets an edge from the latest earlier source of its frame (an
// Enter's: the frame of its input) for d: a chained node of d, d's input gate, or an Exit of a
// loop holding chained nodes of d. The edge comes straight from the source when the source's
// liveness atoms are a subset of the target's (it runs in every execution the target runs in,
// in the same iteration), else through a ControlTrigger on d reading the source (a join: it
// runs once the source ran or was found dead, and is never dead itself, so it neither kills the
// target nor lets it pass the source). Appends the edges to `edges` and adds the joins to
// `graph`; sets parallel_iterations to 1 on the Enters of every loop that holds a chained node
// (directly or in a nested loop), so that one iteration's launches all come before the next
// one's. Returns the number of Enters so changed.
int order_in_frames(tfc::GraphDef& graph, const LivenessClasses& live,
                    const std::vector<int>& order, const std::vector<int>& gates,
                    std::vector<std::pair<int, int>>* edges) {
  const int n = graph.node_size();
  std::unordered_map<std::string, int> index;
  for (int v = 0; v < n; ++v) index[graph.node(v).name()] = v;
  const auto source_frame = [&](int v) { return first_input_frame(graph, index, live, v); };
  const auto is_target = [&](int v) {
    const tfc::NodeDef& node = graph.node(v);
    return chained(node) && !is_control_flow_op(node.op()) && !is_gate(node) &&
           !live.of[static_cast<size_t>(v)].empty();
  };
  std::map<int, int> parent;  // loop frame -> the frame its Enters read from
  for (int v = 0; v < n; ++v)
    if (is_op(graph.node(v), "Enter") && live.frame[static_cast<size_t>(v)] > 0 &&
        graph.node(v).input_size() > 0)
      parent[live.frame[static_cast<size_t>(v)]] = source_frame(v);
  // loop frame -> the devices of the chained nodes in it, nested loops' included
  std::map<int, std::set<std::string>> loop_devices;
  for (int v = 0; v < n; ++v) {
    if (!is_target(v)) continue;
    for (int f = live.frame[static_cast<size_t>(v)];
         f > 0 && loop_devices[f].insert(graph.node(v).device()).second;) {
      const auto up = parent.find(f);
      f = up == parent.end() ? -1 : up->second;
    }
  }
  const auto devices_in = [&](int frame) {
    const auto it = loop_devices.find(frame);
    return it == loop_devices.end() ? std::set<std::string>{} : it->second;
  };
  struct Source {
    int node;
    std::string device;  // the chain it belongs to
  };
  std::map<int, std::vector<Source>> sources;  // frame -> its sources so far, in order
  for (int g : gates) sources[0].push_back({g, graph.node(g).device()});
  const auto is_subset = [&](int a, int b) {
    const auto& x = live.atoms[static_cast<size_t>(a)];
    const auto& y = live.atoms[static_cast<size_t>(b)];
    return std::includes(y.begin(), y.end(), x.begin(), x.end());
  };
  std::map<std::pair<int, std::string>, int> joins;  // (source, device) -> its join's index
  std::vector<std::pair<int, std::string>> new_joins;
  // The join of `source` for `device`'s chain: the one the graph has (a chain kept), else a new
  // one, added below.
  const auto join_name = [&](int source, const std::string& device) {
    const tfc::NodeDef& s = graph.node(source);
    return s.name() + "/npusim_order_join" +
           (device == s.device() ? "" : "_" + device_suffix(device));
  };
  const auto join = [&](int source, const std::string& device) {
    if (const auto kept = index.find(join_name(source, device)); kept != index.end())
      return kept->second;
    const auto [it, added] =
        joins.emplace(std::make_pair(source, device), n + static_cast<int>(new_joins.size()));
    if (added) new_joins.emplace_back(source, device);
    return it->second;
  };
  for (int v : order) {
    if (v >= n || live.frame[static_cast<size_t>(v)] < 0) continue;
    const tfc::NodeDef& node = graph.node(v);
    const bool enter = is_op(node, "Enter") && node.input_size() > 0;
    const bool target = is_target(v);
    if (enter || target) {
      const int frame = enter ? source_frame(v) : live.frame[static_cast<size_t>(v)];
      const std::set<std::string> devices = enter ? devices_in(live.frame[static_cast<size_t>(v)])
                                                  : std::set<std::string>{node.device()};
      const std::vector<Source>& earlier = sources[frame];
      for (const std::string& device : devices) {
        const auto it = std::find_if(earlier.rbegin(), earlier.rend(),
                                     [&](const Source& s) { return s.device == device; });
        if (frame < 0 || it == earlier.rend()) continue;
        edges->emplace_back(is_subset(it->node, v) ? it->node : join(it->node, device), v);
      }
      if (target) sources[frame].push_back({v, node.device()});
    }
    if (is_op(node, "Exit") && source_frame(v) > 0)
      for (const std::string& device : devices_in(source_frame(v)))
        sources[live.frame[static_cast<size_t>(v)]].push_back({v, device});
  }
  for (const auto& [source, device] : new_joins) {
    const std::string name = join_name(source, device);
    tfc::NodeDef& t = *graph.add_node();
    t.set_name(name);
    t.set_op("ControlTrigger");
    t.set_device(device);
    t.add_input("^" + graph.node(source).name());
    (*t.mutable_attr())[kJoinAttr].set_b(true);
  }
  int changed = 0;
  for (int v = 0; v < n; ++v) {
    tfc::NodeDef& node = *graph.mutable_node(v);
    if (!is_op(node, "Enter") || !loop_devices.count(live.frame[static_cast<size_t>(v)])) continue;
    auto& iterations = (*node.mutable_attr())["parallel_iterations"];
    if (iterations.i() == 1) continue;
    iterations.set_i(1);
    ++changed;
  }
  return changed;
}

}  // namespace

bool launch_order_enabled() {
  const char* v = std::getenv("NPUSIM_LAUNCH_ORDER");
  return !v || std::string(v) != "0";
}

int order_npu_launches(tfc::GraphDef& graph) {
  bool control_flow = false;
  for (const tfc::NodeDef& node : graph.node()) control_flow |= is_control_flow_op(node.op());
  const std::vector<int> gates = add_input_gates(graph);
  std::vector<std::pair<int, int>> copy_gates = add_copy_gates(graph);
  for (const auto& gate : add_read_back_gates(graph)) copy_gates.push_back(gate);
  const int n = graph.node_size();
  std::unordered_map<std::string, int> index;
  for (int v = 0; v < n; ++v) index[graph.node(v).name()] = v;
  // With control flow: each node's frame and liveness atoms (graph_liveness.h), and a node
  // n + f per loop frame f that every Enter of f precedes and every Exit of f follows
  // (launch_order.h, "Control flow").
  LivenessClasses live;
  int frames = 0;
  if (control_flow) {
    live = liveness_classes(graph);
    for (int f : live.frame) frames = std::max(frames, f + 1);
  }
  const auto is = [&](int v, const char* op) { return is_op(graph.node(v), op); };
  const auto input_frame = [&](int v) { return first_input_frame(graph, index, live, v); };
  // Edges (data and control) from producer to consumer; unknown inputs are outside the graph,
  // the edges out of NextIteration go to the next iteration and are left out.
  const size_t total = static_cast<size_t>(n + frames);
  std::vector<std::vector<int>> succ(total);
  std::vector<int> indeg(total, 0);
  const auto add_edge = [&](int from, int to) {
    succ[static_cast<size_t>(from)].push_back(to);
    ++indeg[static_cast<size_t>(to)];
  };
  for (int v = 0; v < n; ++v) {
    for (const std::string& in : graph.node(v).input()) {
      const auto it = index.find(split_input(in).first);
      if (it == index.end() || (control_flow && is(it->second, "NextIteration"))) continue;
      add_edge(it->second, v);
    }
    if (!control_flow) continue;
    if (is(v, "Enter") && live.frame[static_cast<size_t>(v)] > 0)
      add_edge(v, n + live.frame[static_cast<size_t>(v)]);
    if (is(v, "Exit") && input_frame(v) > 0) add_edge(n + input_frame(v), v);
  }
  // Kahn's algorithm, the ready node with the fewest asynchronous ops upstream first, then a
  // loop's Enters after every other ready node unless an Enter of that loop was taken already,
  // then by position (a copy gate's: the node it follows, so it comes right after it). So a loop
  // starts once nothing else of its parent frame is ready, and runs to its Exits before another
  // loop starts: its frame's nodes are not interleaved with those of the parent frame (which
  // no chain edge orders against them: launch_order.h, "Control flow"). upstream[v]: the most
  // asynchronous ops on a path into v (v itself not counted); final once v is ready, since all
  // its producers have been taken.
  std::vector<int> upstream(total, 0), position(total);
  for (size_t v = 0; v < total; ++v) position[v] = static_cast<int>(v);
  for (const auto& [gate, producer] : copy_gates) position[static_cast<size_t>(gate)] = producer;
  std::set<int> opened;  // loop frames an Enter of which was taken
  const auto unopened_enter = [&](int v) {
    return control_flow && v < n && is(v, "Enter") && live.frame[static_cast<size_t>(v)] > 0 &&
           !opened.count(live.frame[static_cast<size_t>(v)]);
  };
  // (upstream asynchronous ops, an Enter of a loop not started, position, node)
  using Key = std::tuple<int, int, int, int>;
  std::priority_queue<Key, std::vector<Key>, std::greater<Key>> ready;
  const auto push = [&](int v) {
    ready.push({upstream[static_cast<size_t>(v)], unopened_enter(v) ? 1 : 0,
                position[static_cast<size_t>(v)], v});
  };
  for (int v = 0; v < static_cast<int>(total); ++v)
    if (indeg[static_cast<size_t>(v)] == 0) push(v);
  std::vector<int> order;
  while (!ready.empty()) {
    const auto [up_v, later, pos, v] = ready.top();
    ready.pop();
    if (later && !unopened_enter(v)) {  // its loop started meanwhile
      push(v);
      continue;
    }
    if (control_flow && v < n && is(v, "Enter")) opened.insert(live.frame[static_cast<size_t>(v)]);
    order.push_back(v);
    const int level = upstream[static_cast<size_t>(v)] + (v < n && is_async(graph.node(v)) ? 1 : 0);
    for (int s : succ[static_cast<size_t>(v)]) {
      int& up = upstream[static_cast<size_t>(s)];
      up = std::max(up, level);
      if (--indeg[static_cast<size_t>(s)] == 0) push(s);
    }
  }
  if (order.size() != total) return 0;     // a cycle: not a graph TensorFlow would run
  std::vector<std::pair<int, int>> edges;  // (predecessor, node) to add
  int added = control_flow ? order_in_frames(graph, live, order, gates, &edges) : 0;
  if (!control_flow) {
    // device -> its chained nodes in order, its input gate first: the gate reads only
    // arguments, which have no inputs, so an edge from it goes forward in some topological
    // order too.
    std::map<std::string, std::vector<int>> chain;
    for (int g : gates) chain[graph.node(g).device()].push_back(g);
    for (int v : order)
      if (chained(graph.node(v)) && !is_gate(graph.node(v)))
        chain[graph.node(v).device()].push_back(v);
    for (const auto& [device, nodes] : chain)
      for (size_t k = 1; k < nodes.size(); ++k) edges.emplace_back(nodes[k - 1], nodes[k]);
  }
  for (const auto& [pred, v] : edges) {
    tfc::NodeDef& node = *graph.mutable_node(v);
    const std::string& pred_name = graph.node(pred).name();
    const std::string edge = "^" + pred_name;
    if (std::find(node.input().begin(), node.input().end(), edge) != node.input().end()) continue;
    node.add_input(edge);  // control inputs come after the data inputs
    ++added;
    // A node still chained from an earlier call (a chain kept: unchain_npu_launches) keeps
    // its records; the new edge stays with the graph.
    if (node.attr().count(kOrderAfterAttr)) continue;
    tfc::AttrValue own, via;  // the node's control inputs without the chain; NoOps' inputs
    own.mutable_list();
    via.mutable_list();
    for (const std::string& in : node.input())
      if (!in.empty() && in[0] == '^' && in != edge) {
        own.mutable_list()->add_s(in.substr(1));
        for (const std::string& source : noop_sources(graph, index, in.substr(1)))
          via.mutable_list()->add_s(in.substr(1) + ">" + source);
      }
    (*node.mutable_attr())[kOrderAfterAttr].set_s(pred_name);
    (*node.mutable_attr())[kOwnControlInputsAttr] = own;
    (*node.mutable_attr())[kOwnControlViaAttr] = via;
  }
  return added;
}

namespace {

// A chained node's recorded control inputs as they can be given back in a graph of nodes
// `names`: each recorded input, or, for a NoOp that is gone, the nodes it waited for. A name
// that is gone and has nothing recorded in its place (or whose recorded sources are gone) is
// left out; restorable() says whether there is none.
std::vector<std::string> own_control_inputs(const tfc::NodeDef& node,
                                            const std::unordered_set<std::string>& names,
                                            bool* complete = nullptr) {
  if (complete) *complete = true;
  std::vector<std::string> inputs;
  const auto own = node.attr().find(kOwnControlInputsAttr);
  if (own == node.attr().end()) return inputs;
  const auto via = node.attr().find(kOwnControlViaAttr);
  for (const std::string& in : own->second.list().s()) {
    if (names.count(in)) {
      inputs.push_back(in);
      continue;
    }
    bool replaced = false;
    if (via != node.attr().end())
      for (const std::string& pair : via->second.list().s()) {
        const size_t sep = pair.find('>');
        if (pair.compare(0, sep, in) != 0 || sep != in.size()) continue;
        const std::string source = pair.substr(sep + 1);
        replaced = true;
        if (names.count(source))
          inputs.push_back(source);
        else if (complete)
          *complete = false;
      }
    if (!replaced && complete) *complete = false;
  }
  return inputs;
}

bool restorable(const tfc::NodeDef& node, const std::unordered_set<std::string>& names) {
  bool complete = true;
  own_control_inputs(node, names, &complete);
  return complete;
}

}  // namespace

int unchain_npu_launches(tfc::GraphDef& graph) {
  std::unordered_set<std::string> names, gates;
  for (const tfc::NodeDef& node : graph.node()) {
    names.insert(node.name());
    if (is_any_gate(node)) gates.insert(node.name());
  }
  for (const tfc::NodeDef& node : graph.node()) {
    // A recorded control input whose node is gone, not a NoOp whose inputs were recorded: a
    // pass replaced it and may have dropped the edges it handed on as redundant with the chain,
    // which no record restores. Keep the chain then.
    if (!restorable(node, names)) return -1;
    // A gate's output read as data (no pass of ours does): the gate stays, and the chain.
    for (const std::string& in : node.input())
      if (!in.empty() && in[0] != '^' && gates.count(split_input(in).first)) return -1;
  }
  // The gates go, with every control edge from them (a pass may have handed one on).
  auto& nodes = *graph.mutable_node();
  const auto removed = std::remove_if(nodes.begin(), nodes.end(), is_any_gate);
  int unchained = static_cast<int>(nodes.end() - removed);
  nodes.erase(removed, nodes.end());
  for (tfc::NodeDef& node : nodes) {
    auto& inputs = *node.mutable_input();
    inputs.erase(std::remove_if(inputs.begin(), inputs.end(),
                                [&](const std::string& in) {
                                  return !in.empty() && in[0] == '^' && gates.count(in.substr(1));
                                }),
                 inputs.end());
  }
  for (tfc::NodeDef& node : nodes) {
    auto& attrs = *node.mutable_attr();
    const auto after = attrs.find(kOrderAfterAttr);
    if (after == attrs.end()) continue;
    const std::string edge = "^" + after->second.s();
    auto& inputs = *node.mutable_input();
    const auto chain = std::find(inputs.begin(), inputs.end(), edge);
    if (chain != inputs.end()) inputs.erase(chain);
    for (const std::string& in : own_control_inputs(node, names))
      if (std::find(inputs.begin(), inputs.end(), "^" + in) == inputs.end())
        node.add_input("^" + in);
    attrs.erase(kOrderAfterAttr);
    attrs.erase(kOwnControlInputsAttr);
    attrs.erase(kOwnControlViaAttr);
    ++unchained;
  }
  return unchained;
}

}  // namespace npusim::tf
