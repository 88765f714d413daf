package adminapi

import (
	"embed"
	"io/fs"
	"net/http"
)

// The dashboard: plain HTML, CSS and JavaScript embedded in the binary,
// with no library and nothing fetched from elsewhere, so it works offline.
//
//go:embed web
var webFiles embed.FS

func (s *Server) registerUI(mux *http.ServeMux) {
	sub, err := fs.Sub(webFiles, "web")
	if err != nil {
		panic(err) // the embedded tree is part of the build
	}
	files := http.FileServerFS(sub)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'")
		http.ServeFileFS(w, r, sub, "index.html")
	})
	mux.Handle("GET /ui/", http.StripPrefix("/ui/", files))
}
