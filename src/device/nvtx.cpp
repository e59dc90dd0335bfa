#include "device/nvtx.h"

#ifdef ASYNCTP_WITH_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace asynctp::nvtx {

#ifdef ASYNCTP_WITH_NVTX

namespace {

// Created on first use, the one NVTX call that decides whether a tool is attached; null without.
nvtxDomainHandle_t domain() {
  static const nvtxDomainHandle_t handle = nvtxDomainCreateA(std::string(kDomain).c_str());
  return handle;
}

}  // namespace

bool compiled_in() {
  return true;
}

bool attached() {
  static const bool on = domain() != nullptr;
  return on;
}

void Range::push(uint32_t argb, const std::string& text) {
  nvtxEventAttributes_t attr{};
  attr.version = NVTX_VERSION;
  attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attr.colorType = NVTX_COLOR_ARGB;
  attr.color = argb;
  attr.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attr.message.ascii = text.c_str();
  nvtxDomainRangePushEx(domain(), &attr);
}

void Range::pop() {
  nvtxDomainRangePop(domain());
}

#else

bool compiled_in() {
  return false;
}

bool attached() {
  return false;
}

void Range::push(uint32_t, const std::string&) {}

void Range::pop() {}

#endif

}  // namespace asynctp::nvtx
