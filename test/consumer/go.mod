// A relying party's module: it depends on github.com/openconstellation/constellation/pkg
// through the module proxy protocol only (hack/check-consumer.sh adds the requirement of the
// version it publishes to a file proxy), never through a replace line or this repository.
module example.com/relyingparty

go 1.26.0
