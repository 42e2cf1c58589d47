// mlc native runner: runs an mlc artifact on a device without Python, with only the artifact's
// runtime/libtvm_ffi.so and runtime/libtvm_runtime.so.
//
//   mlc_runner ARTIFACT_DIR INPUT_DIR OUTPUT_DIR [REPEAT]
//
// Reads INPUT_DIR/in_0.npy, in_1.npy, ... (the model's inputs in order) and maps the weights file the
// manifest names beside model.so, runs the model once,
// writes OUTPUT_DIR/out_0.npy, ... (its outputs in order), then runs it REPEAT more times and
// prints one JSON line: {"outputs": N, "times_ms": [...]}. Errors go to stderr, exit code 1.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/dtype.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace ffi = tvm::ffi;

namespace {

// TVM kernels assume 64-byte aligned buffers.
struct AlignedAlloc {
  void AllocData(DLTensor* tensor) {
    size_t size = ffi::GetDataSize(*tensor);
    tensor->data = std::aligned_alloc(64, (size + 63) / 64 * 64 + 64);
    if (tensor->data == nullptr) throw std::runtime_error("out of memory");
  }
  void FreeData(DLTensor* tensor) { std::free(tensor->data); }
};

DLDataType ParseDescr(const std::string& descr) {
  // e.g. '<f4', '<i8', '|b1', '|u1'
  if (descr.size() < 3 || descr[0] == '>') throw std::runtime_error("unsupported npy dtype " + descr);
  int bytes = std::stoi(descr.substr(2));
  switch (descr[1]) {
    case 'f': return DLDataType{kDLFloat, static_cast<uint8_t>(bytes * 8), 1};
    case 'i': return DLDataType{kDLInt, static_cast<uint8_t>(bytes * 8), 1};
    case 'u': return DLDataType{kDLUInt, static_cast<uint8_t>(bytes * 8), 1};
    case 'b': return DLDataType{kDLBool, 8, 1};
    default: throw std::runtime_error("unsupported npy dtype " + descr);
  }
}

std::string Descr(DLDataType dtype) {
  int bytes = (dtype.bits + 7) / 8;
  switch (dtype.code) {
    case kDLFloat: return "<f" + std::to_string(bytes);
    case kDLInt: return "<i" + std::to_string(bytes);
    case kDLUInt: return "<u" + std::to_string(bytes);
    case kDLBool: return "|b1";
    default: throw std::runtime_error("unsupported output dtype code " + std::to_string(dtype.code));
  }
}

std::string HeaderValue(const std::string& header, const std::string& key) {
  size_t at = header.find("'" + key + "'");
  if (at == std::string::npos) throw std::runtime_error("npy header lacks " + key);
  return header.substr(header.find(':', at) + 1);
}

ffi::Tensor ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  char magic[8];
  in.read(magic, 8);
  if (!in || std::memcmp(magic, "\x93NUMPY", 6) != 0) throw std::runtime_error(path + " is not an .npy file");
  uint32_t header_len = 0;
  if (magic[6] == 1) {
    uint16_t len16;
    in.read(reinterpret_cast<char*>(&len16), 2);
    header_len = len16;
  } else {
    in.read(reinterpret_cast<char*>(&header_len), 4);
  }
  std::string header(header_len, ' ');
  in.read(&header[0], header_len);
  std::string descr = HeaderValue(header, "descr");
  descr = descr.substr(descr.find('\'') + 1);
  descr = descr.substr(0, descr.find('\''));
  std::string order = HeaderValue(header, "fortran_order");
  if (order.substr(0, order.find(',')).find("True") != std::string::npos)
    throw std::runtime_error(path + " is in Fortran order; save it C-contiguous");
  std::string shape_text = HeaderValue(header, "shape");
  shape_text = shape_text.substr(shape_text.find('(') + 1, shape_text.find(')') - shape_text.find('(') - 1);
  std::vector<int64_t> shape;
  std::stringstream items(shape_text);
  for (std::string item; std::getline(items, item, ',');) {
    if (item.find_first_not_of(" ") != std::string::npos) shape.push_back(std::stoll(item));
  }
  ffi::Tensor tensor = ffi::Tensor::FromNDAlloc(AlignedAlloc(), ffi::ShapeView(shape.data(), shape.size()),
                                                ParseDescr(descr), DLDevice{kDLCPU, 0});
  size_t size = ffi::GetDataSize(*tensor.GetDLTensorPtr());
  in.read(static_cast<char*>(tensor.GetDLTensorPtr()->data), size);
  if (static_cast<size_t>(in.gcount()) != size) throw std::runtime_error(path + " is truncated");
  return tensor;
}

void WriteNpy(const std::string& path, const ffi::Tensor& tensor) {
  const DLTensor* t = tensor.GetDLTensorPtr();
  std::string shape;
  for (int i = 0; i < t->ndim; ++i) shape += std::to_string(t->shape[i]) + (t->ndim == 1 ? "," : (i + 1 < t->ndim ? ", " : ""));
  std::string header = "{'descr': '" + Descr(t->dtype) + "', 'fortran_order': False, 'shape': (" + shape + "), }";
  size_t total = 10 + header.size() + 1;
  header += std::string((64 - total % 64) % 64, ' ') + "\n";
  std::ofstream out(path, std::ios::binary);
  uint16_t len = static_cast<uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.write(reinterpret_cast<const char*>(&len), 2);
  out << header;
  out.write(static_cast<const char*>(t->data) + t->byte_offset, ffi::GetDataSize(*t));
  if (!out) throw std::runtime_error("cannot write " + path);
}

void Flatten(const ffi::Any& value, std::vector<ffi::Tensor>* out) {
  if (auto tensor = value.as<ffi::Tensor>()) {
    out->push_back(*tensor);
  } else if (auto array = value.as<ffi::Array<ffi::Any>>()) {
    for (const ffi::Any& item : *array) Flatten(item, out);
  } else {
    throw std::runtime_error("model returned something other than tensors");
  }
}

bool Exists(const std::string& path) { return std::ifstream(path).good(); }

// A tensor over bytes of the mapped weights file (which outlives every tensor: it is never unmapped).
struct MappedAlloc {
  char* data;
  void AllocData(DLTensor* tensor) { tensor->data = data; }
  void FreeData(DLTensor*) {}
};

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The weights `library`'s main takes after the inputs (manifest "weights", schema 3): views of the mapped file.
std::vector<ffi::Tensor> LoadWeights(const std::string& artifact, const std::string& library) {
  namespace json = ffi::json;
  json::Object manifest = json::Parse(ReadText(artifact + "/manifest.json")).cast<json::Object>();
  auto all = manifest.Get("weights");
  if (!all.has_value()) return {};
  auto entry = all->cast<json::Object>().Get(library);
  if (!entry.has_value()) return {};
  json::Object info = entry->cast<json::Object>();
  std::string file = info.at("file").cast<ffi::String>();
  if (file.find('/') != std::string::npos) throw std::runtime_error("manifest names a weights file outside the artifact");
  std::string path = artifact + "/" + file;
  int fd = open(path.c_str(), O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) throw std::runtime_error("cannot open " + path);
  void* base = st.st_size ? mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
  close(fd);
  if (base == MAP_FAILED) throw std::runtime_error("cannot map " + path);
  std::vector<ffi::Tensor> weights;
  for (const ffi::Any& item : info.at("tensors").cast<json::Array>()) {
    json::Object spec = item.cast<json::Object>();
    int64_t offset = spec.at("offset").cast<int64_t>(), nbytes = spec.at("nbytes").cast<int64_t>();
    if (offset < 0 || nbytes < 0 || offset + nbytes > st.st_size) throw std::runtime_error(path + " is truncated");
    std::vector<int64_t> shape;
    for (const ffi::Any& d : spec.at("shape").cast<json::Array>()) shape.push_back(d.cast<int64_t>());
    DLDataType dtype = ffi::StringToDLDataType(spec.at("dtype").cast<ffi::String>());
    weights.push_back(ffi::Tensor::FromNDAlloc(MappedAlloc{static_cast<char*>(base) + offset},
                                               ffi::ShapeView(shape.data(), shape.size()), dtype, DLDevice{kDLCPU, 0}));
  }
  return weights;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: mlc_runner ARTIFACT_DIR INPUT_DIR OUTPUT_DIR [REPEAT]\n";
    return 2;
  }
  std::string artifact = argv[1], input_dir = argv[2], output_dir = argv[3];
  int repeat = argc > 4 ? std::atoi(argv[4]) : 0;
  try {
    // CPU only: a GPU artifact's inputs and outputs would need device copies this runner does not make.
    auto target = ffi::json::Parse(ReadText(artifact + "/manifest.json")).cast<ffi::json::Object>().at("target");
    auto device = target.cast<ffi::json::Object>().Get("device");
    if (device.has_value() && device->cast<ffi::String>() != "cpu")
      throw std::runtime_error("this is a " + std::string(device->cast<ffi::String>()) +
                               " artifact and the native runner runs CPU artifacts only; run it with python run.py");
    std::string runtime = artifact + "/runtime/libtvm_runtime.so";
    if (dlopen(runtime.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) throw std::runtime_error(dlerror());
    ffi::Module library = ffi::Module::LoadFromFile(artifact + "/model.so");
    ffi::Module vm = library->GetFunction("vm_load_executable").value()().cast<ffi::Module>();
    vm->GetFunction("vm_initialization").value()(1, 0, 2, 1, 0, 2);  // CPU, pooled allocator
    ffi::Function run = vm->GetFunction("main").value();

    std::vector<ffi::Tensor> inputs;
    for (int i = 0; Exists(input_dir + "/in_" + std::to_string(i) + ".npy"); ++i)
      inputs.push_back(ReadNpy(input_dir + "/in_" + std::to_string(i) + ".npy"));
    std::vector<ffi::Tensor> weights = LoadWeights(artifact, "model.so");
    std::vector<ffi::AnyView> args(inputs.begin(), inputs.end());
    args.insert(args.end(), weights.begin(), weights.end());
    auto call = [&]() {
      ffi::Any result;
      run.CallPacked(args.data(), static_cast<int32_t>(args.size()), &result);
      return result;
    };
    std::vector<ffi::Tensor> outputs;
    Flatten(call(), &outputs);
    for (size_t i = 0; i < outputs.size(); ++i) WriteNpy(output_dir + "/out_" + std::to_string(i) + ".npy", outputs[i]);

    std::string times;
    for (int i = 0; i < repeat; ++i) {
      auto start = std::chrono::steady_clock::now();
      call();
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      times += (i ? "," : "") + std::to_string(ms);
    }
    std::cout << "{\"outputs\": " << outputs.size() << ", \"times_ms\": [" << times << "]}" << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
