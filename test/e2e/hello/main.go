// Command hello is the workload of the end-to-end tests (image localhost/constellation/hello):
// an HTTP server on :8080 (or $PORT) that answers every request with its pod name ($POD_NAME,
// else the hostname), so a test can tell which replica answered through a Service.
package main

import (
	"fmt"
	"log"
	"net/http"
	"os"
)

func main() {
	name := os.Getenv("POD_NAME")
	if name == "" {
		host, err := os.Hostname()
		if err != nil {
			log.Fatalf("hello: hostname: %v", err)
		}
		name = host
	}
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	http.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "hello from %s\n", name)
	})
	log.Printf("hello: %s listening on :%s", name, port)
	log.Fatal(http.ListenAndServe(":"+port, nil))
}
