// A minimal NVTX tool for the tests: NVTX loads it where NVTX_INJECTION64_PATH names it (as nsys
// sets it), and it records, one line each, what a profiler would see of asynctp:
//   "domain <name>"                      a domain created
//   "push <domain> <ARGB hex> <text>"    a range pushed on a domain
//   "pop <domain>"                       a range popped
//   "stream <name>"                      a CUDA stream named
// The test reads the record through support/nvtx_record.h.
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include <nvtx3/nvToolsExt.h>

namespace {

std::mutex g_mu;
std::deque<std::string> g_domains;  // a domain's handle is the address of its name here
std::vector<std::string> g_events;
std::string g_snapshot;

void record(std::string line) {
  const std::lock_guard lock(g_mu);
  g_events.push_back(std::move(line));
}

const std::string& domain_name(nvtxDomainHandle_t domain) {
  static const std::string kDefault = "(default)";
  return domain == nullptr ? kDefault : *reinterpret_cast<const std::string*>(domain);
}

nvtxDomainHandle_t NVTX_API domain_create(const char* name) {
  const std::lock_guard lock(g_mu);
  g_domains.emplace_back(name);
  g_events.push_back("domain " + g_domains.back());
  return reinterpret_cast<nvtxDomainHandle_t>(&g_domains.back());
}

int NVTX_API range_push(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* attr) {
  char color[16];
  std::snprintf(color, sizeof color, "%08x", attr->colorType == NVTX_COLOR_ARGB ? attr->color : 0);
  const char* text = attr->messageType == NVTX_MESSAGE_TYPE_ASCII ? attr->message.ascii : "";
  record("push " + domain_name(domain) + " " + color + " " + text);
  return 0;
}

int NVTX_API range_pop(nvtxDomainHandle_t domain) {
  record("pop " + domain_name(domain));
  return 0;
}

void NVTX_API name_cuda_stream(void*, const char* name) {
  record(std::string("stream ") + name);
}

// Puts `fn` into slot `id` of `module`'s table; false if the table is not that long.
template <typename Fn>
bool install(const NvtxExportTableCallbacks* callbacks, NvtxCallbackModule module, unsigned id,
             Fn fn) {
  NvtxFunctionTable table = nullptr;
  unsigned size = 0;
  if (!callbacks->GetModuleFunctionTable(module, &table, &size) || table == nullptr || id >= size)
    return false;
  *table[id] = reinterpret_cast<NvtxFunctionPointer>(fn);
  return true;
}

}  // namespace

extern "C" {

// NVTX's entry point into a tool (nvtxDetail/nvtxInit.h).
__attribute__((visibility("default"))) int InitializeInjectionNvtx2(
    NvtxGetExportTableFunc_t get_export_table) {
  const auto* callbacks =
      static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr) return 0;
  const bool core =
      install(callbacks, NVTX_CB_MODULE_CORE2, NVTX_CBID_CORE2_DomainCreateA, &domain_create) &&
      install(callbacks, NVTX_CB_MODULE_CORE2, NVTX_CBID_CORE2_DomainRangePushEx, &range_push) &&
      install(callbacks, NVTX_CB_MODULE_CORE2, NVTX_CBID_CORE2_DomainRangePop, &range_pop);
  // The CUDA runtime's naming calls: present where the process uses them (CUDA builds).
  install(callbacks, NVTX_CB_MODULE_CUDART, NVTX_CBID_CUDART_NameCudaStreamA, &name_cuda_stream);
  return core ? 1 : 0;
}

// The record so far, one event a line; valid until the next call.
__attribute__((visibility("default"))) const char* asynctp_nvtx_record() {
  const std::lock_guard lock(g_mu);
  g_snapshot.clear();
  for (const std::string& e : g_events)
    g_snapshot += e + "\n";
  return g_snapshot.c_str();
}

__attribute__((visibility("default"))) void asynctp_nvtx_clear_record() {
  const std::lock_guard lock(g_mu);
  g_events.clear();
}

}  // extern "C"
