// Uses the installed package's `cuda` component (multidev::cuda, or
// pkg-config multidev-cuda): the "cuda" backend has the CUDA runtime layer,
// so it lists the GPUs, or none and the runtime's own reason (no GPU or no
// driver here), never "no CUDA runtime".
#include <multidev/multidev.hpp>

#include <cstdio>
#include <string>

int main() {
  multidev::backend b{multidev::backend_options{.driver = "cuda"}};
  std::string props = b.static_properties().to_string();
  bool linked = props.find("no CUDA runtime") == std::string::npos;
  std::printf("multidev cuda component: %s with %d device(s), runtime layer %s\n",
              b.name().c_str(), b.num_devices(), linked ? "linked" : "MISSING");
  if (!linked)
    std::printf("%s\n", props.c_str());
  return linked ? 0 : 1;
}
