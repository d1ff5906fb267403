#include "server/transport/reflection_service.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include <set>

namespace hgemm {
namespace {

namespace pb = google::protobuf;
namespace rf = grpc::reflection::v1alpha;

// `file` and everything it imports, each once, the file itself first.
void AddFileAndImports(const pb::FileDescriptor* file, std::set<std::string>* added,
                       rf::FileDescriptorResponse* response) {
  if (!added->insert(file->name()).second) return;
  pb::FileDescriptorProto proto;
  file->CopyTo(&proto);
  response->add_file_descriptor_proto(proto.SerializeAsString());
  for (int i = 0; i < file->dependency_count(); ++i) {
    AddFileAndImports(file->dependency(i), added, response);
  }
}

void NotFound(const std::string& what, rf::ServerReflectionResponse* response) {
  response->mutable_error_response()->set_error_code(int(grpc::StatusCode::NOT_FOUND));
  response->mutable_error_response()->set_error_message(what + " not found");
}

// One stream: each request read is answered, one write at a time.
class ReflectionReactor final
    : public grpc::ServerBidiReactor<rf::ServerReflectionRequest, rf::ServerReflectionResponse> {
 public:
  explicit ReflectionReactor(const ReflectionService& service) : service_(service) {
    StartRead(&request_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);
    response_ = service_.Answer(request_);
    StartWrite(&response_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::CANCELLED);
    StartRead(&request_);
  }
  void OnDone() override { delete this; }

 private:
  const ReflectionService& service_;
  rf::ServerReflectionRequest request_;
  rf::ServerReflectionResponse response_;
};

}  // namespace

grpc::ServerBidiReactor<rf::ServerReflectionRequest, rf::ServerReflectionResponse>*
ReflectionService::ServerReflectionInfo(grpc::CallbackServerContext*) {
  return new ReflectionReactor(*this);
}

rf::ServerReflectionResponse ReflectionService::Answer(
    const rf::ServerReflectionRequest& request) const {
  const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
  rf::ServerReflectionResponse response;
  response.set_valid_host(request.host());
  *response.mutable_original_request() = request;
  std::set<std::string> added;
  switch (request.message_request_case()) {
    case rf::ServerReflectionRequest::kListServices:
      for (const std::string& name : services_) {
        response.mutable_list_services_response()->add_service()->set_name(name);
      }
      break;
    case rf::ServerReflectionRequest::kFileByFilename:
      if (const pb::FileDescriptor* file = pool->FindFileByName(request.file_by_filename())) {
        AddFileAndImports(file, &added, response.mutable_file_descriptor_response());
      } else {
        NotFound("file " + request.file_by_filename(), &response);
      }
      break;
    case rf::ServerReflectionRequest::kFileContainingSymbol:
      if (const pb::FileDescriptor* file =
              pool->FindFileContainingSymbol(request.file_containing_symbol())) {
        AddFileAndImports(file, &added, response.mutable_file_descriptor_response());
      } else {
        NotFound("symbol " + request.file_containing_symbol(), &response);
      }
      break;
    case rf::ServerReflectionRequest::kFileContainingExtension: {
      const rf::ExtensionRequest& e = request.file_containing_extension();
      const pb::Descriptor* type = pool->FindMessageTypeByName(e.containing_type());
      const pb::FieldDescriptor* field =
          type == nullptr ? nullptr : pool->FindExtensionByNumber(type, e.extension_number());
      if (field != nullptr) {
        AddFileAndImports(field->file(), &added, response.mutable_file_descriptor_response());
      } else {
        NotFound("extension " + std::to_string(e.extension_number()) + " of " + e.containing_type(),
                 &response);
      }
      break;
    }
    case rf::ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const pb::Descriptor* type =
          pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr) {
        NotFound("type " + request.all_extension_numbers_of_type(), &response);
        break;
      }
      std::vector<const pb::FieldDescriptor*> extensions;
      pool->FindAllExtensions(type, &extensions);
      rf::ExtensionNumberResponse* numbers = response.mutable_all_extension_numbers_response();
      numbers->set_base_type_name(type->full_name());
      for (const pb::FieldDescriptor* f : extensions) numbers->add_extension_number(f->number());
      break;
    }
    default:
      response.mutable_error_response()->set_error_code(int(grpc::StatusCode::INVALID_ARGUMENT));
      response.mutable_error_response()->set_error_message("no request in the message");
  }
  return response;
}

}  // namespace hgemm
