"use strict";(self.rspackChunkpathways_nb_lab=self.rspackChunkpathways_nb_lab||[]).push([[266],{"./node_modules/css-loader/dist/cjs.js!./style/index.css"(e,t,n){var r=n("./node_modules/css-loader/dist/runtime/noSourceMaps.js"),o=n.n(r),s=n("./node_modules/css-loader/dist/runtime/api.js"),a=(n.n(s))()(o());a.push([e.id,`.pw-panel {
  padding: 6px 8px;
  overflow: auto;
  font-size: var(--jp-ui-font-size1);
  color: var(--jp-ui-font-color1);
  background: var(--jp-layout-color1);
}
.pw-panel-bar {
  display: flex;
  gap: 4px;
  flex-wrap: wrap;
}
.pw-panel-bar select,
.pw-panel-bar input {
  flex: 1 1 10em;
  min-width: 8em;
}
.pw-panel-error {
  color: var(--jp-error-color1);
}
.pw-panel table.dataframe {
  border-collapse: collapse;
  font-size: var(--jp-ui-font-size0);
}
.pw-panel table.dataframe td,
.pw-panel table.dataframe th {
  padding: 1px 6px;
  border-bottom: 1px solid var(--jp-border-color2);
  text-align: left;
}
.pw-panel h3,
.pw-panel h4 {
  margin: 10px 0 4px;
}
.pw-legend {
  display: flex;
  flex-wrap: wrap;
  gap: 4px 12px;
  margin: 2px 0 4px;
  font-size: var(--jp-ui-font-size0);
}
.pw-legend i {
  display: inline-block;
  width: 10px;
  height: 10px;
  margin-right: 4px;
  vertical-align: middle;
}
.pw-panel-launch,
.pw-panel-actions {
  margin-top: 4px;
  align-items: center;
}
.pw-panel-launch input {
  flex: 0 0 3.5em;
  min-width: 3.5em;
  width: 3.5em;
}
`,""]),n.d(t,{},{A:a})},"./node_modules/css-loader/dist/runtime/api.js"(e){e.exports=function(e){var t=[];return t.toString=function(){return this.map(function(t){var n="",r=void 0!==t[5];return t[4]&&(n+="@supports (".concat(t[4],") {")),t[2]&&(n+="@media ".concat(t[2]," {")),r&&(n+="@layer".concat(t[5].length>0?" ".concat(t[5]):""," {")),n+=e(t),r&&(n+="}"),t[2]&&(n+="}"),t[4]&&(n+="}"),n}).join("")},t.i=function(e,n,r,o,s){"string"==typeof e&&(e=[[null,e,void 0]]);var a={};if(r)for(var i=0;i<this.length;i++){var l=this[i][0];null!=l&&(a[l]=!0)}for(var d=0;d<e.length;d++){var p=[].concat(e[d]);r&&a[p[0]]||(void 0!==s&&(void 0===p[5]||(p[1]="@layer".concat(p[5].length>0?" ".concat(p[5]):""," {").concat(p[1],"}")),p[5]=s),n&&(p[2]&&(p[1]="@media ".concat(p[2]," {").concat(p[1],"}")),p[2]=n),o&&(p[4]?(p[1]="@supports (".concat(p[4],") {").concat(p[1],"}"),p[4]=o):p[4]="".concat(o)),t.push(p))}},t}},"./node_modules/css-loader/dist/runtime/noSourceMaps.js"(e){e.exports=function(e){return e[1]}},"./style/index.css"(e,t,n){n.r(t);var r=n("./node_modules/style-loader/dist/runtime/injectStylesIntoStyleTag.js"),o=n.n(r),s=n("./node_modules/style-loader/dist/runtime/styleDomAPI.js"),a=n.n(s),i=n("./node_modules/style-loader/dist/runtime/insertBySelector.js"),l=n.n(i),d=n("./node_modules/style-loader/dist/runtime/setAttributesWithoutAttributes.js"),p=n.n(d),u=n("./node_modules/style-loader/dist/runtime/insertStyleElement.js"),c=n.n(u),m=n("./node_modules/style-loader/dist/runtime/styleTagTransform.js"),f=n.n(m),y=n("./node_modules/css-loader/dist/cjs.js!./style/index.css"),v={};v.styleTagTransform=f(),v.setAttributes=p(),v.insert=l().bind(null,"head"),v.domAPI=a(),v.insertStyleElement=c(),o()(y.A,v);let h=y.A&&y.A.locals?y.A.locals:void 0;n.d(t,{},{default:h})},"./node_modules/style-loader/dist/runtime/injectStylesIntoStyleTag.js"(e){var t=[];function n(e){for(var n=-1,r=0;r<t.length;r++)if(t[r].identifier===e){n=r;break}return n}function r(e,r){for(var o={},s=[],a=0;a<e.length;a++){var i=e[a],l=r.base?i[0]+r.base:i[0],d=o[l]||0,p="".concat(l," ").concat(d);o[l]=d+1;var u=n(p),c={css:i[1],media:i[2],sourceMap:i[3],supports:i[4],layer:i[5]};if(-1!==u)t[u].references++,t[u].updater(c);else{var m=function(e,t){var n=t.domAPI(t);return n.update(e),function(t){t?(t.css!==e.css||t.media!==e.media||t.sourceMap!==e.sourceMap||t.supports!==e.supports||t.layer!==e.layer)&&n.update(e=t):n.remove()}}(c,r);r.byIndex=a,t.splice(a,0,{identifier:p,updater:m,references:1})}s.push(p)}return s}e.exports=function(e,o){var s=r(e=e||[],o=o||{});return function(e){e=e||[];for(var a=0;a<s.length;a++){var i=n(s[a]);t[i].references--}for(var l=r(e,o),d=0;d<s.length;d++){var p=n(s[d]);0===t[p].references&&(t[p].updater(),t.splice(p,1))}s=l}}},"./node_modules/style-loader/dist/runtime/insertBySelector.js"(e){var t={};e.exports=function(e,n){var r=function(e){if(void 0===t[e]){var n=document.querySelector(e);if(window.HTMLIFrameElement&&n instanceof window.HTMLIFrameElement)try{n=n.contentDocument.head}catch(e){n=null}t[e]=n}return t[e]}(e);if(!r)throw Error("Couldn't find a style target. This probably means that the value for the 'insert' parameter is invalid.");r.appendChild(n)}},"./node_modules/style-loader/dist/runtime/insertStyleElement.js"(e){e.exports=function(e){var t=document.createElement("style");return e.setAttributes(t,e.attributes),e.insert(t,e.options),t}},"./node_modules/style-loader/dist/runtime/setAttributesWithoutAttributes.js"(e,t,n){e.exports=function(e){var t=n.nc;t&&e.setAttribute("nonce",t)}},"./node_modules/style-loader/dist/runtime/styleDomAPI.js"(e){e.exports=function(e){if("u"<typeof document)return{update:function(){},remove:function(){}};var t=e.insertStyleElement(e);return{update:function(n){var r,o,s;r="",n.supports&&(r+="@supports (".concat(n.supports,") {")),n.media&&(r+="@media ".concat(n.media," {")),(o=void 0!==n.layer)&&(r+="@layer".concat(n.layer.length>0?" ".concat(n.layer):""," {")),r+=n.css,o&&(r+="}"),n.media&&(r+="}"),n.supports&&(r+="}"),(s=n.sourceMap)&&"u">typeof btoa&&(r+="\n/*# sourceMappingURL=data:application/json;base64,".concat(btoa(unescape(encodeURIComponent(JSON.stringify(s))))," */")),e.styleTagTransform(r,t,e.options)},remove:function(){var e;null===(e=t).parentNode||e.parentNode.removeChild(e)}}}},"./node_modules/style-loader/dist/runtime/styleTagTransform.js"(e){e.exports=function(e,t){if(t.styleSheet)t.styleSheet.cssText=e;else{for(;t.firstChild;)t.removeChild(t.firstChild);t.appendChild(document.createTextNode(e))}}}}]);